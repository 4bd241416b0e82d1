"""Retries for remote media: throttling, timeouts and lost replies are the store's problem, not the caller's.

S3 answers a burst of requests with ``503 SlowDown`` for seconds at a time, a
network drops a reply now and then, an endpoint goes away for a while. obstore
retries a little on its own (five times, under a second in all); that is sized
for a blip, not for throttling. Every request casmon sends to a remote medium
therefore goes through :meth:`Retrier.run`: a failure that may pass is tried
again with exponential backoff and jitter (0.25 s doubling to 8 s) until
:data:`RETRY_SECONDS` have passed; what cannot pass (a missing key, a missing
bucket, refused credentials, a bad argument) is raised at once.

Every casmon request is safe to send again after it failed: reads,
create-if-absent of content-addressed objects and of files named by their
writer (a retry of one that landed finds it there), whole-key overwrites,
deletes. The one request whose outcome matters beyond "it is there" --
creating the store lock -- reads its token back (:mod:`casmon.store.lock`). A
first attempt that lands only after its retry and later requests is another
matter: docs/RELIABILITY.md, "Known limits under storage faults".

After a request has failed for its whole budget the medium counts as *down*:
later requests are tried once, without waiting, until one succeeds, so a
store that is away costs each cached call one quick attempt rather than half
a minute. What they could not write waits for the next flush.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from casmon.errors import CasmonError, env_seconds

__all__ = ["RETRY_SECONDS", "Retrier", "transient"]

T = TypeVar("T")

#: How long (seconds) one request is retried before it fails; the environment variable
#: ``CASMON_RETRY_SECONDS`` sets it (tests shorten it).
RETRY_SECONDS = env_seconds("CASMON_RETRY_SECONDS", 30.0, above_low=False)
FIRST_DELAY = 0.25
MAX_DELAY = 8.0

#: Errors that say something about the request, not about the weather: never retried.
_PERMANENT = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError,
              CasmonError, ValueError, TypeError, KeyError, AttributeError, NotImplementedError, AssertionError,
              BufferError)
#: obstore's errors that are answers, not failures (matched by name: obstore is optional).
_PERMANENT_NAMES = frozenset({"NotFoundError", "AlreadyExistsError", "InvalidPathError", "NotSupportedError",
                              "PermissionDeniedError", "PreconditionError", "NotModifiedError",
                              "UnauthenticatedError", "UnknownConfigurationKeyError"})
#: Answers S3 gives in a generic error that no retry changes.
_PERMANENT_TEXT = ("NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403 Forbidden",
                   "InvalidBucketName", "builder error", "dns error", "InvalidRange", "416 Range Not Satisfiable")


def transient(e: BaseException) -> bool:
    """True if ``e`` may pass on its own: throttling, a timeout, a dropped connection, a server error."""
    if not isinstance(e, Exception) or isinstance(e, _PERMANENT):
        return isinstance(e, (ConnectionError, TimeoutError))  # OSError subclasses that do pass
    if type(e).__name__ in _PERMANENT_NAMES:
        return False
    text = str(e)
    return not any(t in text for t in _PERMANENT_TEXT)


class Retrier:
    """Runs one medium's requests with retries (see the module doc); one per backend, shared by its threads."""

    def __init__(self, seconds: float | None = None) -> None:
        #: The retry budget of one request, in seconds (None: :data:`RETRY_SECONDS`, read when used).
        self.seconds = seconds
        #: Requests that failed at least once and were sent again, for tests and ``casmon stats``.
        self.retries = 0
        #: When the medium went down (monotonic), or None while it answers.
        self.down_since: float | None = None
        self._rng = random.Random()

    def budget(self) -> float:
        return RETRY_SECONDS if self.seconds is None else self.seconds

    def delays(self) -> list[float]:
        """The waits between attempts, within the budget: doubling from FIRST_DELAY, each with jitter."""
        out, total, d = [], 0.0, FIRST_DELAY
        budget = self.budget()
        while total < budget:
            wait = min(d, MAX_DELAY) * (0.5 + 0.5 * self._rng.random())  # half fixed, half jitter
            wait = min(wait, budget - total)
            out.append(wait)
            total += wait
            d *= 2
        return out

    async def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """Await ``make()``, again after each transient failure while the budget lasts."""
        import asyncio  # not at import: importing casmon starts no event-loop machinery

        waits = [] if self.down_since is not None else self.delays()
        deadline = time.monotonic() + self.budget()
        attempt = 0
        while True:
            try:
                result = await make()
            except BaseException as e:
                if not transient(e):
                    self.down_since = None  # an answer: the medium is up
                    raise
                if attempt >= len(waits) or time.monotonic() >= deadline:
                    if self.down_since is None:
                        self.down_since = time.monotonic()
                    raise
                self.retries += 1
                await asyncio.sleep(waits[attempt])
                attempt += 1
                continue
            self.down_since = None
            return result
