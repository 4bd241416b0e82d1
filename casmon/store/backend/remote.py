"""What every asynchronous medium shares: its requests on casmon's event loop, retried, batched, and forked.

zarr's stores and obstore's clients are asynchronous and casmon's features are
not. A subclass says how to send one request of each kind (the ``_a*``
coroutines); this class runs them: each on casmon's event-loop thread
(:mod:`.loop`) while the caller waits, with the medium's retries
(:mod:`.retry`), a batch up to ``concurrency`` at a time, and a write ticking
:attr:`Backend.while_waiting` while it is in flight. A forked child makes its
client again (:meth:`RemoteBackend._forked`): the parent's client is bound to
the parent's loop and threads.
"""

from __future__ import annotations

import abc
import functools
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from casmon.errors import CasmonError, StoreError
from casmon.scrub import scrub
from casmon.store.backend import loop
from casmon.store.backend.base import Backend
from casmon.store.backend.retry import Retrier
from casmon.view import text as view_text

if TYPE_CHECKING:
    from concurrent.futures import Future

    from casmon.store.backend.base import BytesLike, Data

__all__ = ["RemoteBackend", "client_error", "OPEN_SECONDS"]

T = TypeVar("T")

#: How long opening a remote store retries reaching it (seconds): through a 10 s outage, not half a minute for a typo.
OPEN_SECONDS = 12.0


def client_error(e: BaseException) -> str:
    """A client's error in one line, saying what to check where the cause is a common one; credentials scrubbed."""
    text = view_text.short_error(e, first_line=True) or type(e).__name__
    low = str(e)
    if "NoSuchBucket" in low:
        return "the bucket does not exist"
    if "InvalidAccessKeyId" in low or "SignatureDoesNotMatch" in low or "403" in low and "Forbidden" in low:
        return "access denied: check the credentials (environment or storage_options)"
    if "error sending request" in low or "Connection refused" in low or "dns error" in low:
        return scrub("cannot reach the endpoint (" + text[:200] + ")")
    return scrub(f"{type(e).__name__}: {text[:300]}")


def _flat(data: BytesLike) -> BytesLike:
    """Bytes, or a flat memoryview of bytes: what every client takes (obstore reads a memoryview of another
    format, a float array's, as a sequence of numbers)."""
    return data if isinstance(data, (bytes, bytearray)) else memoryview(data).cast("B")


class RemoteBackend(Backend):
    """A medium whose requests are coroutines: the ``_a*`` methods, one request each, which subclasses give."""

    def __init__(self, url: str, retrier: Retrier | None, concurrency: int = 16) -> None:
        super().__init__(url, concurrency)
        #: Retries of this medium's requests (None: a medium that does not fail that way, memory or a zip file).
        self.retrier = retrier
        self._pid = os.getpid()

    # -- the medium's requests ------------------------------------------------------
    @abc.abstractmethod
    async def _aget(self, key: str) -> Data | None: ...

    @abc.abstractmethod
    async def _aget_range(self, key: str, start: int, end: int) -> Data | None: ...

    @abc.abstractmethod
    async def _aexists(self, key: str) -> bool: ...

    @abc.abstractmethod
    async def _agetsize(self, key: str) -> int: ...

    @abc.abstractmethod
    async def _aset(self, key: str, data: BytesLike) -> None: ...

    @abc.abstractmethod
    async def _acreate(self, key: str, data: BytesLike) -> None:
        """Write ``key`` unless it exists (then nothing happens: content-addressed or writer-named data)."""

    @abc.abstractmethod
    async def _adelete(self, key: str) -> None:
        """Delete ``key``; a missing key is no error."""

    @abc.abstractmethod
    async def _alist(self, prefix: str) -> list[str]: ...

    @abc.abstractmethod
    async def _alist_dir(self, prefix: str) -> list[str]: ...

    def _forked(self) -> None:
        """Make the medium's client again in a forked child (nothing to do by default)."""

    def _obstore_client(self) -> Any:
        """The obstore store behind this medium (it says when each key was written), else None."""
        return None

    # -- running them ---------------------------------------------------------------
    def _fresh(self) -> None:
        if self._pid != os.getpid():
            self._forked()
            self._pid = os.getpid()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one operation; errors that are not about a file become a :class:`StoreError`."""
        try:
            return loop.run(coro)
        except (OSError, CasmonError, ValueError, TypeError, KeyError):
            raise
        except Exception as e:  # noqa: BLE001 - e.g. obstore's errors: name the store, keep the cause
            raise StoreError(f"{self.url}: {client_error(e)}") from e

    def _call_write(self, coro: Coroutine[Any, Any, T]) -> T:
        """:meth:`_call` for a write: while it is in flight, :attr:`while_waiting` runs every ``wait_tick``."""
        hook = self.while_waiting
        if hook is None:
            return self._call(coro)
        import concurrent.futures

        fut = loop.submit(coro)
        try:
            while True:
                try:
                    return fut.result(timeout=self.wait_tick)
                except concurrent.futures.TimeoutError:
                    try:
                        hook()
                    except Exception:  # noqa: BLE001 - looking after held values is best effort
                        pass
        except (OSError, CasmonError, ValueError, TypeError, KeyError):
            raise
        except Exception as e:  # noqa: BLE001 - as _call
            raise StoreError(f"{self.url}: {client_error(e)}") from e

    def _retried(self, make: Callable[[], Awaitable[T]]) -> Coroutine[Any, Any, T]:
        """``make()`` awaited with this medium's retries (:mod:`.retry`): each request is retried on its own."""
        r = self.retrier
        if r is None:
            async def once() -> T:
                return await make()
            return once()
        return r.run(make)

    def _batch(self, makes: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
        """Each request of a batch, retried on its own, up to ``concurrency`` at once; results in order."""
        return self._call(loop.gather_limited((self._retried(m) for m in makes), self.concurrency))

    # -- Backend's operations ---------------------------------------------------------
    def _get(self, key: str) -> Data | None:
        self._fresh()
        return self._call(self._retried(lambda: self._aget(key)))

    def _get_range(self, key: str, start: int, end: int) -> Data | None:
        self._fresh()
        return self._call(self._retried(lambda: self._aget_range(key, start, end)))

    def _get_many(self, keys: list[str]) -> list[Data | None]:
        self._fresh()
        return self._batch([functools.partial(self._aget, k) for k in keys])

    def _get_ranges(self, requests: list[tuple[str, int, int]]) -> list[Data | None]:
        self._fresh()
        return self._batch([functools.partial(self._aget_range, k, s, e) for k, s, e in requests])

    def _exists_many(self, keys: list[str]) -> list[bool]:
        self._fresh()
        if len(keys) == 1:
            return [self._call(self._retried(lambda: self._aexists(keys[0])))]
        return self._batch([functools.partial(self._aexists, k) for k in keys])

    def _getsize(self, key: str) -> int:
        self._fresh()
        return self._call(self._retried(lambda: self._agetsize(key)))

    def _getsize_many(self, keys: list[str]) -> list[int]:
        self._fresh()

        async def one(k: str) -> int:
            try:
                return await self._retried(lambda: self._agetsize(k))
            except FileNotFoundError:
                return 0

        return self._call(loop.gather_limited((one(k) for k in keys), self.concurrency))

    def _list(self, prefix: str) -> list[str]:
        self._fresh()
        return self._call(self._retried(lambda: self._alist(prefix)))

    def _list_dir(self, prefix: str) -> list[str]:
        self._fresh()
        return self._call(self._retried(lambda: self._alist_dir(prefix)))

    def _landed(self, keys: list[str]) -> list[float | None] | None:
        self._fresh()
        ob = self._obstore_client()
        if ob is None:
            return None
        import obstore

        async def one(k: str) -> float | None:
            try:
                meta = await self._retried(lambda: obstore.head_async(ob, k))
            except FileNotFoundError:
                return None
            return float(meta["last_modified"].timestamp())

        return self._call(loop.gather_limited((one(k) for k in keys), self.concurrency))

    def _list_landed(self, prefix: str) -> dict[str, float] | None:
        self._fresh()
        ob = self._obstore_client()
        if ob is None:
            return None
        import obstore

        base = prefix if prefix.endswith("/") or not prefix else prefix + "/"

        async def go() -> dict[str, float]:
            out: dict[str, float] = {}
            for batch in await obstore.list(ob, prefix=base).collect_async():
                for meta in batch if isinstance(batch, list) else [batch]:
                    path = str(meta["path"])
                    if "/" not in path[len(base):]:
                        out[path] = float(meta["last_modified"].timestamp())
            return out

        return self._call(self._retried(go))

    def _write(self, key: str, parts: Sequence[BytesLike], exclusive: bool) -> None:
        data = _flat(parts[0]) if len(parts) == 1 else b"".join(parts)
        self._fresh()
        self._call_write(self._retried(lambda: self._acreate(key, data) if exclusive else self._aset(key, data)))

    def _write_many(self, items: Sequence[tuple[str, BytesLike]]) -> None:
        self._fresh()
        self._call_write(loop.gather_limited(
            (self._retried(functools.partial(self._acreate, k, _flat(d))) for k, d in items), self.concurrency))

    def _create_async(self, key: str, data: BytesLike) -> Future[None]:
        self._fresh()
        self.requests += 1
        flat = _flat(data)
        return loop.submit(self._retried(lambda: self._acreate(key, flat)))

    def _delete_many(self, keys: list[str]) -> None:
        self._fresh()
        if len(keys) == 1:
            self._call(self._retried(lambda: self._adelete(keys[0])))
            return
        self._batch([functools.partial(self._adelete, k) for k in keys])
