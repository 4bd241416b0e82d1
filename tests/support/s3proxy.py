"""A fault-injecting HTTP/1.1 proxy between an S3 client (obstore, boto3) and moto's server.

Why: the failures that matter for a store on S3 are the ones a mock inside the client cannot make:
a PUT whose reply was lost (the object landed, the client saw an error), a PUT held past the client's
timeout that lands later, 503 SlowDown storms, connections reset mid-request, truncated bodies. The
proxy sits on 127.0.0.1 between the real client and the real S3 API, forwards every request byte for
byte (the Host header included: S3 signatures cover it) and, per request, applies the first matching
:class:`Rule`. Tests read moto directly, not through the proxy, for the ground truth of what landed.

Usage from synchronous test code::

    with FaultProxy(moto_url) as proxy:               # or proxy = FaultProxy(url); proxy.start()
        proxy.add(Rule("drop_after", method="PUT"))  # the PUT lands, its reply is lost
        store = S3Store(bucket, endpoint=proxy.url, ...)
        ...
        assert proxy.counts(action="drop_after") == 1

The proxy runs an asyncio event loop on a daemon thread of its own; every public method is
thread-safe. Each request goes upstream over a fresh upstream connection (no pooling: an injected
fault never leaves a half-used upstream connection behind), while client connections are kept alive
for as many requests as the client sends. Requests go upstream byte for byte; replies too, except
their hop-by-hop ``Connection``/``Keep-Alive`` headers, which the proxy sets itself: it reads every
reply to its end, so it keeps the client's connection open even though moto's server closes every
connection (``Connection: close``), and keep-alive clients (obstore, boto3) reuse it.

Actions (``Rule.action``):

``drop_before``
    Close the client connection without forwarding: upstream never sees the request.
``drop_after``
    Forward, wait for upstream's whole reply, then close the client connection without replying
    (the "lost reply": the request took effect, the client sees a failure).
``reset``
    Abort the client connection with a TCP RST (``SO_LINGER`` 0) without forwarding.
``status``
    Answer ``Rule.status`` without forwarding (503: S3's ``SlowDown`` XML error, 500:
    ``InternalError``), with ``Content-Length`` and keep-alive honoured.
``delay_before``
    Sleep ``Rule.delay`` seconds, then forward normally. If the client closes its connection
    meanwhile, the request is abandoned, *not* forwarded (a proxy that notices its client left).
``hold``
    Like ``delay_before``, but the request is forwarded after the delay even if the client gave up
    meanwhile (the "late write": the client saw a timeout, the object lands later). The client gets
    the reply only if it is still connected.
``delay_after``
    Forward, then sleep ``Rule.delay`` before replying (the request took effect early, the reply is
    late; a client timing out meanwhile sees a failure).
``truncate``
    Forward, then send the status line, the headers and half of the body (raw bytes as framed
    upstream), then close. A reply without a body gets half of its head instead, so the client always
    sees a broken reply.

For ``drop_before``, ``reset`` and ``status`` a nonzero ``Rule.delay`` is slept before acting; for
``drop_after`` and ``truncate`` it is slept after upstream's reply, before acting.

Requests a client sends with ``Expect: 100-continue`` get ``100 Continue`` from the proxy at once
(the whole request is read before any rule applies); upstream's own interim 1xx replies are dropped.
``proxy.stop()`` cancels whatever is still in flight (a ``hold`` still sleeping never lands): call
``proxy.wait_idle()`` first when a test needs the late write to happen.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

__all__ = ["S3_ERRORS", "Action", "FaultProxy", "OutageMode", "Rule", "Seen", "status_reply"]

Action = Literal["drop_before", "drop_after", "reset", "status", "delay_before", "delay_after", "hold", "truncate"]
OutageMode = Literal["503", "500", "reset", "drop"]

_ACTIONS: frozenset[str] = frozenset(get_args(Action))
_OUTAGE_ACTIONS: dict[str, tuple[Action, int]] = {
    "503": ("status", 503), "500": ("status", 500), "reset": ("reset", 503), "drop": ("drop_before", 503)}

#: S3's error codes and messages for the statuses a ``status`` rule answers with.
S3_ERRORS: dict[int, tuple[str, str]] = {
    503: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
}

#: The longest request or response head (request line or status line plus headers) the proxy reads.
_HEAD_LIMIT = 1 << 20
#: How long one upstream exchange may take before the proxy gives up and answers 502.
_UPSTREAM_TIMEOUT = 60.0
#: How often a sleeping ``delay_before``/``hold``/``delay_after`` looks whether its client left.
_POLL = 0.01


@dataclass(eq=False)
class Rule:
    """One fault: what to do (``action``) to which requests, how often, and for how long.

    ``method`` matches the HTTP method (case-insensitive); ``path`` is a substring of, or a compiled
    regular expression searched in, the request's path as sent (percent-encoded, without the query).
    A request matching both is a *matching request*. The first ``after`` matching requests pass
    untouched; then each matching request draws from ``proxy.random`` when ``probability`` < 1 (a
    request that loses the draw passes on to the next rules); the rule applies at most ``times`` times
    (``None``: without limit) and only within ``duration`` seconds of being added (``None``: forever).
    ``delay`` is the sleep of the delaying actions (see the module's docstring for the others);
    ``status`` is the status a ``status`` rule answers with.

    ``matched`` and ``applied`` count, for tests, the matching requests seen and the times applied.
    """

    action: Action
    method: str | None = None
    path: str | re.Pattern[str] | None = None
    times: int | None = None
    probability: float = 1.0
    after: int = 0
    delay: float = 0.0
    status: int = 503
    duration: float | None = None
    matched: int = field(default=0, init=False)
    applied: int = field(default=0, init=False)
    added: float | None = field(default=None, init=False, repr=False)
    released: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.action not in _ACTIONS:
            raise ValueError(f"unknown action {self.action!r}; one of {sorted(_ACTIONS)}")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"probability must be within [0, 1], not {self.probability}")
        if (self.times is not None and self.times < 0) or self.after < 0 or self.delay < 0:
            raise ValueError("times, after and delay must not be negative")
        if not 100 <= self.status <= 599:
            raise ValueError(f"not an HTTP status: {self.status}")

    def release(self) -> None:
        """End the sleep of the requests this rule delays (``delay_before``, ``hold``) now, and of those to come:
        a test holds a request for as long as it needs, however slow the machine, then lets it go."""
        self.released = True

    @property
    def spent(self) -> bool:
        """Whether the rule has applied ``times`` times already."""
        return self.times is not None and self.applied >= self.times

    def live(self, now: float) -> bool:
        """Whether the rule may still apply at ``now`` (``time.monotonic()``): not spent, not expired."""
        if self.spent:
            return False
        return self.duration is None or self.added is None or now - self.added < self.duration

    def matches(self, method: str, path: str) -> bool:
        """Whether a request with this method and path (without the query) is a matching request."""
        if self.method is not None and self.method.upper() != method.upper():
            return False
        return _path_matches(self.path, path)


@dataclass(frozen=True)
class Seen:
    """One request the proxy handled, logged when its handling ended (a reply: just before it is sent).

    ``action`` is the action applied (``None``: plain forwarding); ``status`` the status sent back to
    the client (``None``: none was sent); ``upstream_status`` upstream's status (``None``: the request
    was not forwarded, or upstream failed); ``time`` is ``time.monotonic()`` when the request had been
    read; ``connection`` numbers the client connection (1, 2, ...; equal numbers: one kept-alive
    connection); ``chunked`` says whether the request body came with ``Transfer-Encoding: chunked``.
    """

    method: str
    path: str
    query: str
    action: str | None
    status: int | None
    time: float
    upstream_status: int | None = None
    connection: int = 0
    chunked: bool = False


def _path_matches(pattern: str | re.Pattern[str] | None, path: str) -> bool:
    if pattern is None:
        return True
    if isinstance(pattern, str):
        return pattern in path
    return pattern.search(path) is not None


class _BadMessage(Exception):
    """A request or response the proxy cannot parse as HTTP/1.1."""


def _parse_headers(lines: list[bytes]) -> list[tuple[str, str]]:
    headers = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise _BadMessage(f"bad header line {line[:100]!r}")
        headers.append((name.decode("latin-1").lower(), value.strip().decode("latin-1")))
    return headers


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    """The value of the header ``name`` (lower case), its repeats joined with commas; ``None``: absent."""
    values = [v for k, v in headers if k == name]
    return ", ".join(values) if values else None


def _tokens(value: str | None) -> list[str]:
    return [t.strip().lower() for t in value.split(",")] if value else []


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body read to its end (the last chunk and the trailers), as the raw bytes framed."""
    parts = []
    while True:
        line = await reader.readuntil(b"\r\n")
        parts.append(line)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _BadMessage(f"bad chunk size line {line[:100]!r}") from None
        if size < 0:
            raise _BadMessage(f"bad chunk size line {line[:100]!r}")
        if size == 0:
            while True:  # trailers, up to the empty line
                trailer = await reader.readuntil(b"\r\n")
                parts.append(trailer)
                if trailer == b"\r\n":
                    return b"".join(parts)
        chunk = await reader.readexactly(size + 2)
        if not chunk.endswith(b"\r\n"):
            raise _BadMessage("chunk not followed by CRLF")
        parts.append(chunk)


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[str, str]]) -> tuple[bytes, bool] | None:
    """The body framed by ``headers`` and whether it was chunked; ``None``: no framing (read to close)."""
    codings = _tokens(_header(headers, "transfer-encoding"))
    if codings:
        if codings[-1] != "chunked":
            return None
        return await _read_chunked(reader), True
    length = _header(headers, "content-length")
    if length is not None:
        try:
            n = int(length.split(",")[0])
        except ValueError:
            raise _BadMessage(f"bad Content-Length {length!r}") from None
        if n < 0:
            raise _BadMessage(f"bad Content-Length {length!r}")
        return await reader.readexactly(n), False
    return b"", False


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    head: bytes
    body: bytes
    chunked: bool

    @property
    def path(self) -> str:
        return urlsplit(self.target).path if "://" in self.target else self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return urlsplit(self.target).query if "://" in self.target else self.target.partition("?")[2]

    @property
    def keep_alive(self) -> bool:
        tokens = _tokens(_header(self.headers, "connection"))
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Request | None:
    """The next request on a client connection, body included; ``None``: the client closed cleanly."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial.strip():
            raise _BadMessage("connection closed inside a request head") from None
        return None
    except asyncio.LimitOverrunError:
        raise _BadMessage("request head too long") from None
    head = head.lstrip(b"\r\n")  # RFC 9112 2.2: ignore empty lines before the request line
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadMessage(f"bad request line {lines[0][:100]!r}")
    method, target, version = parts
    headers = _parse_headers(lines[1:])
    if "100-continue" in _tokens(_header(headers, "expect")) and version == "HTTP/1.1":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    framed = await _read_body(reader, headers)
    if framed is None:
        raise _BadMessage("a request body must be chunked or have a Content-Length")
    body, chunked = framed
    return _Request(method, target, version, headers, head, body, chunked)


@dataclass
class _Response:
    status: int
    head: bytes
    body: bytes
    framed: bool  # the body's end is known (Content-Length, chunked, or no body); False: it ended at close

    def head_for_client(self, keep_alive: bool) -> bytes:
        """The head with its hop-by-hop ``Connection``/``Keep-Alive`` headers replaced by the proxy's own."""
        lines = self.head[:-4].split(b"\r\n")
        kept = [lines[0]] + [line for line in lines[1:]
                             if line.partition(b":")[0].strip().lower() not in (b"connection", b"keep-alive")]
        kept.append(b"Connection: keep-alive" if keep_alive else b"Connection: close")
        return b"\r\n".join(kept) + b"\r\n\r\n"


async def _read_response(reader: asyncio.StreamReader, method: str) -> _Response:
    """Upstream's final reply to a request made with ``method``: interim 1xx replies are skipped."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise _BadMessage(f"bad status line {lines[0][:100]!r}")
        status = int(parts[1])
        if not 100 <= status < 200 or status == 101:
            break
    headers = _parse_headers(lines[1:])
    if method.upper() == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return _Response(status, head, b"", True)
    codings = _tokens(_header(headers, "transfer-encoding"))
    if codings and codings[-1] == "chunked":
        return _Response(status, head, await _read_chunked(reader), True)
    if not codings and _header(headers, "content-length") is not None:
        framed = await _read_body(reader, headers)
        assert framed is not None
        return _Response(status, head, framed[0], True)
    return _Response(status, head, await reader.read(), False)  # no framing: the body ends at close


def status_reply(status: int, method: str = "GET", keep_alive: bool = True) -> bytes:
    """The bytes of an S3-style error reply with ``status``: the XML error body, ``Content-Length`` set.

    503 is S3's ``SlowDown``, 500 its ``InternalError``; other statuses get their HTTP reason phrase,
    spaces removed, as the code. A reply to HEAD carries no body (its ``Content-Length`` still says
    how long the body would have been).
    """
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    code, message = S3_ERRORS.get(status, (phrase.replace(" ", ""), phrase))
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            "<RequestId>casmon-faultproxy</RequestId></Error>").encode()
    head = (f"HTTP/1.1 {status} {phrase}\r\n"
            "Content-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\n"
            "x-amz-request-id: casmon-faultproxy\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n").encode()
    return head if method.upper() == "HEAD" else head + body


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 (a free port) in front of ``upstream``, applying :class:`Rule` s.

    ``upstream`` is the server's base URL (``http://127.0.0.1:PORT``). ``url`` is the proxy's, for the
    client's endpoint (``AWS_ENDPOINT_URL``). ``random`` draws for rules with ``probability`` < 1:
    assign ``random.Random(seed)`` for reproducible faults (draws happen in the order requests are
    read, so sequential requests give a reproducible pattern).
    """

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL, not {upstream!r}")
        self.upstream = upstream
        self._up_host: str = parts.hostname
        self._up_port: int = parts.port or 80
        self.random: random.Random = random.Random()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._rules: list[Rule] = []
        self._log: list[Seen] = []
        self._in_flight = 0
        self._connections = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._port: int | None = None

    # -- life cycle ---------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Start listening (on its own daemon thread); returns the proxy. Starting twice is an error."""
        if self._loop is not None:
            raise RuntimeError("FaultProxy already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=self._run, args=(loop,), name=f"FaultProxy({self.upstream})",
                                        daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), loop).result(timeout=10)
        return self

    def stop(self) -> None:
        """Close every connection, cancel what is in flight, stop the loop and join its thread.

        Idempotent. A ``hold`` still sleeping is cancelled and never reaches upstream: call
        :meth:`wait_idle` first to let in-flight requests finish.
        """
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The proxy's base URL, ``http://127.0.0.1:PORT`` (once started)."""
        if self._port is None:
            raise RuntimeError("FaultProxy not started")
        return f"http://127.0.0.1:{self._port}"

    # -- rules --------------------------------------------------------------------------------------

    def add(self, rule: Rule) -> Rule:
        """Add ``rule`` after the others (the first matching live rule wins); returns it.

        A rule's ``duration`` runs from now.
        """
        with self._lock:
            rule.added = time.monotonic()
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Remove every rule (requests in flight keep the rule they already drew)."""
        with self._lock:
            self._rules.clear()

    @property
    def rules(self) -> list[Rule]:
        """A copy of the rules, in the order they are tried."""
        with self._lock:
            return list(self._rules)

    def outage(self, seconds: float, mode: OutageMode = "503", *, from_first_request: bool = False) -> Rule:
        """Make every request for the next ``seconds`` fail: ``"503"`` (SlowDown), ``"500"``, ``"reset"``, ``"drop"``.

        The outage's rule goes before all others, so it wins while it lasts; returns it. With
        ``from_first_request`` its ``seconds`` run from the first request it meets, not from now: the code
        under test meets it however slowly a loaded machine gets there.
        """
        if mode not in _OUTAGE_ACTIONS:
            raise ValueError(f"unknown outage mode {mode!r}; one of {sorted(_OUTAGE_ACTIONS)}")
        action, status = _OUTAGE_ACTIONS[mode]
        rule = Rule(action, status=status, duration=seconds)
        with self._lock:
            rule.added = None if from_first_request else time.monotonic()
            self._rules.insert(0, rule)
        return rule

    # -- what happened ------------------------------------------------------------------------------

    @property
    def log(self) -> list[Seen]:
        """A copy of the log: every request whose handling ended, in that order (not the order of arrival).

        A request whose reply the client has received is in the log; one still in flight (a ``hold``
        asleep, a ``drop_after`` waiting on upstream) is not yet: see :meth:`wait_idle`.
        """
        with self._lock:
            return list(self._log)

    def counts(self, action: str | None = None, method: str | None = None,
               path: str | re.Pattern[str] | None = None) -> int:
        """How many logged requests match: ``None`` filters nothing; ``action="forward"`` counts plain forwards."""
        def keep(s: Seen) -> bool:
            if action is not None and s.action != (None if action == "forward" else action):
                return False
            if method is not None and s.method.upper() != method.upper():
                return False
            return _path_matches(path, s.path)

        return sum(1 for s in self.log if keep(s))

    @property
    def in_flight(self) -> int:
        """How many requests have been read and not yet finished (a ``hold`` asleep counts)."""
        with self._lock:
            return self._in_flight

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no request is in flight (``hold`` and delays done); ``False`` on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout=timeout)

    # -- the loop's side ----------------------------------------------------------------------------

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _open(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=_HEAD_LIMIT)
        self._port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _choose(self, req: _Request, now: float) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if not rule.live(now) or not rule.matches(req.method, req.path):
                    continue
                if rule.added is None:  # an outage from its first request: it starts now
                    rule.added = now
                rule.matched += 1
                if rule.matched <= rule.after:
                    continue
                if rule.probability < 1.0 and self.random.random() >= rule.probability:
                    continue
                rule.applied += 1
                return rule
        return None

    def _record(self, seen: Seen) -> int:
        with self._lock:
            self._log.append(seen)
            return len(self._log) - 1

    def _unsent(self, index: int) -> None:
        """The reply logged at ``index`` could not be sent: its status becomes ``None``."""
        with self._lock:
            self._log[index] = dataclasses.replace(self._log[index], status=None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: requests one after another, until either side closes."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn = next(self._connections)
        try:
            while True:
                try:
                    req = await _read_request(reader, writer)
                except _BadMessage:
                    await _send(writer, status_reply(400, keep_alive=False))
                    break
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    break
                if req is None:
                    break
                with self._lock:
                    self._in_flight += 1
                try:
                    keep = await self._handle(req, reader, writer, conn)
                finally:
                    with self._idle:
                        self._in_flight -= 1
                        self._idle.notify_all()
                if not keep:
                    break
        except asyncio.CancelledError:
            pass  # stop(): end quietly (asyncio 3.11 reports a cancelled connection task as an error)
        finally:
            self._tasks.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, asyncio.CancelledError):
                pass

    async def _handle(self, req: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      conn: int) -> bool:
        """Apply the first matching rule to ``req`` (or forward it); whether the connection stays open."""
        received = time.monotonic()
        rule = self._choose(req, received)
        action = rule.action if rule is not None else None

        def log(status: int | None, upstream: int | None) -> int:
            return self._record(Seen(req.method, req.path, req.query, action, status, received, upstream, conn,
                                     req.chunked))

        async def reply(data: bytes, status: int, upstream: int | None) -> bool:
            # logged before sending: a client that has its reply finds the request in the log
            index = log(status, upstream)
            sent = await _send(writer, data)
            if not sent:
                self._unsent(index)
            return sent

        if rule is not None and rule.action in ("drop_before", "reset", "status"):
            if rule.delay:
                await asyncio.sleep(rule.delay)
            if rule.action == "drop_before":
                log(None, None)
                return False
            if rule.action == "reset":
                log(None, None)
                _reset(writer)
                return False
            keep = req.keep_alive
            sent = await reply(status_reply(rule.status, req.method, keep), rule.status, None)
            return keep and sent

        gone = False
        if rule is not None and rule.action in ("delay_before", "hold"):
            gone = await _wait(rule.delay, reader, writer, stop_when_gone=rule.action == "delay_before", rule=rule)
            if gone and rule.action == "delay_before":
                log(None, None)  # the client left: the request is abandoned, never forwarded
                return False

        try:
            resp = await asyncio.wait_for(self._exchange(req), _UPSTREAM_TIMEOUT)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                _BadMessage):
            if gone:
                log(None, None)
            else:
                await reply(status_reply(502, req.method, keep_alive=False), 502, None)
            return False

        if rule is not None:
            if rule.action == "hold" and (gone or _client_gone(reader, writer)):
                log(None, resp.status)  # the late write landed; nobody is there for the reply
                return False
            if rule.action == "drop_after":
                if rule.delay:
                    await asyncio.sleep(rule.delay)
                log(None, resp.status)
                return False
            if rule.action == "delay_after":
                if await _wait(rule.delay, reader, writer, stop_when_gone=False):
                    log(None, resp.status)
                    return False
            if rule.action == "truncate":
                if rule.delay:
                    await asyncio.sleep(rule.delay)
                head = resp.head_for_client(keep_alive=False)
                cut = head + resp.body[: len(resp.body) // 2] if resp.body else head[: len(head) // 2]
                await reply(cut, resp.status, resp.status)
                return False

        keep = req.keep_alive and resp.framed
        sent = await reply(resp.head_for_client(keep) + resp.body, resp.status, resp.status)
        return sent and keep

    async def _exchange(self, req: _Request) -> _Response:
        """Send ``req`` byte for byte upstream over a new connection and read the whole reply."""
        reader, writer = await asyncio.open_connection(self._up_host, self._up_port, limit=_HEAD_LIMIT)
        try:
            writer.write(req.head + req.body)
            await writer.drain()
            return await _read_response(reader, req.method)
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass


def _client_gone(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Whether the client closed (or reset) its connection; bytes it sent meanwhile stay unread."""
    return reader.at_eof() or reader.exception() is not None or writer.is_closing()


async def _wait(delay: float, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                stop_when_gone: bool, rule: Rule | None = None) -> bool:
    """Sleep ``delay`` seconds without blocking the loop; whether the client left meanwhile.

    With ``stop_when_gone`` the sleep ends as soon as the client leaves; it ends when ``rule`` is released.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + delay
    gone = False
    while True:
        gone = gone or _client_gone(reader, writer)
        left = end - loop.time()
        if left <= 0 or (gone and stop_when_gone) or (rule is not None and rule.released):
            return gone
        await asyncio.sleep(min(left, _POLL))


async def _send(writer: asyncio.StreamWriter, data: bytes) -> bool:
    """Write ``data`` to the client; whether it went out (``False``: the client was gone)."""
    if writer.is_closing():
        return False
    try:
        writer.write(data)
        await writer.drain()
    except OSError:
        return False
    return True


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort the client connection with a TCP RST: ``SO_LINGER`` 0, then close without flushing."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()
