"""casmon's event loop: one asyncio loop on a daemon thread per process, and its thread pool.

zarr's stores are asynchronous and casmon's features synchronous, so every
zarr call runs on this loop and the caller waits for it (zarr's private
``sync`` helper is not used). After a ``fork`` the child makes a loop of its
own. A local folder never starts it: asyncio is imported on first use, not with
casmon.

obstore's runtime threads (Rust, not Python's) hand each request's result to
this loop through ``call_soon_threadsafe``, which runs Python code on them and
releases the GIL in its self-pipe write. Before Python 3.14 a thread that takes
the GIL back once the interpreter finalizes is ended with ``pthread_exit``,
whose unwinding cannot pass their Rust frames: glibc aborts the process
(SIGABRT, nothing on stderr) after the script did all its work
(python/cpython#87135, rust-lang/rust#135929). So :func:`shutdown` waits, before
the interpreter finalizes, until no thread is inside that hand-over
(:class:`_HandOver`), and later hand-overs return at once; it waits for the
loops of others that casmon sends obstore's requests through too (zarr's, for
an export: :func:`guard`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from casmon.errors import StoreError

if TYPE_CHECKING:
    import asyncio
    from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["gather_limited", "get_loop", "guard", "note_remote_client", "run", "shutdown", "submit"]

T = TypeVar("T")

#: Worker threads for blocking I/O (zarr's LocalStore uses asyncio.to_thread).
WORKERS = 8
#: How long (seconds) the exit waits for threads still handing a result to the loop: a few bytecodes and a
#: self-pipe write each, so only a starved machine makes it wait at all.
HANDOVER_SECONDS = 10.0


class _HandOver:
    """The loop's ``call_soon_threadsafe``, counting the threads inside it (see the module doc).

    The count is kept without a lock: under the GIL neither ``+= 1`` nor ``-= 1`` on an attribute can be cut
    (a thread only yields the GIL at a call or a loop's jump), and the decrement is the last thing a thread does
    here, since any call after it could hand the GIL to the exiting main thread and leave this thread to take it
    back once the interpreter finalizes. After :meth:`close` a hand-over returns at once, touching neither the
    stopped loop (nothing would run the callback) nor its self-pipe: a request that completes after the exit
    flush (one abandoned at Ctrl-C) runs as little Python on its thread as can be.
    """

    __slots__ = ("_inner", "_inside", "_closed")

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._inside = 0
        self._closed = False

    def __call__(self, callback: Any, *args: Any, context: Any = None) -> Any:
        if self._closed:
            return None
        self._inside += 1
        try:
            return self._inner(callback, *args, context=context)
        finally:
            self._inside -= 1

    def refuse(self) -> None:
        """Take no more hand-overs: the loop is stopped."""
        self._closed = True

    def wait_idle(self, deadline: float) -> bool:
        """Wait until no thread is inside, or the ``time.monotonic()`` ``deadline``; True if none is left."""
        import time

        while self._inside > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)  # releases the GIL to the threads still inside
        return True


class _Loop:
    """The loop of this process, created on first use."""

    lock = threading.Lock()
    loop: asyncio.AbstractEventLoop | None = None
    pid: int = 0
    thread: threading.Thread | None = None
    handover: _HandOver | None = None
    #: (pid, hand-over) of loops casmon does not own but sends obstore's requests through (zarr's, see :func:`guard`).
    others: list[tuple[int, _HandOver]] = []
    #: A remote store's client was opened in this process (see :func:`shutdown`).
    remote_clients = False


def get_loop() -> asyncio.AbstractEventLoop:
    """casmon's loop in this process, started (with its thread pool) if it is not running yet."""
    loop = _Loop.loop
    if loop is not None and _Loop.pid == os.getpid():
        return loop
    import asyncio

    with _Loop.lock:
        if _Loop.loop is None or _Loop.pid != os.getpid():
            try:
                loop = asyncio.new_event_loop()
                handover = _install(loop)
                loop.set_default_executor(_started_executor(WORKERS))
                from casmon.store import lifecycle

                lifecycle.exit_flush_before_pools()
                t = threading.Thread(target=loop.run_forever, name="casmon-io", daemon=True)
                t.start()
            except RuntimeError as e:  # the interpreter is exiting: no new thread, no new exit hook
                raise StoreError(f"casmon cannot start its I/O thread now ({e}): the interpreter is exiting, so a "
                                 "store that is not a local folder cannot be reached") from None
            _Loop.loop, _Loop.pid, _Loop.thread, _Loop.handover = loop, os.getpid(), t, handover
        return _Loop.loop


def _install(loop: asyncio.AbstractEventLoop) -> _HandOver | None:
    """``loop``'s hand-over, made now if it has none (None: a loop whose methods cannot be replaced)."""
    current = loop.call_soon_threadsafe
    if isinstance(current, _HandOver):
        return current
    handover = _HandOver(current)
    try:
        loop.call_soon_threadsafe = handover  # type: ignore[method-assign,assignment]
    except (AttributeError, TypeError):  # a loop written in C (uvloop): left as it is
        return None
    return handover


def guard(loop: asyncio.AbstractEventLoop) -> None:
    """Have the exit wait, as it does for casmon's own loop, for threads handing results to ``loop``: another
    library's loop (zarr's) that casmon sends obstore's requests through. It stays open: its owner stops it."""
    with _Loop.lock:
        handover = _install(loop)
        pid = os.getpid()
        if handover is not None and (pid, handover) not in _Loop.others:
            _Loop.others.append((pid, handover))


def note_remote_client() -> None:
    """Say that a client with threads of its own (obstore's runtime, fsspec) was opened: its threads
    may call back into the loop after :func:`shutdown`, so the loop is stopped but never closed."""
    _Loop.remote_clients = True


def shutdown() -> None:
    """Stop the loop at interpreter exit, after the last flush, and wait until no thread of a client's (obstore's
    runtime) is inside the hand-over of this loop or of one :func:`guard` named: one still there when the
    interpreter finalizes aborts the process (see the module doc)."""
    import time

    pid = os.getpid()
    with _Loop.lock:
        loop, thread, handover = _Loop.loop, _Loop.thread, _Loop.handover
        if loop is not None and _Loop.pid == pid:
            _Loop.loop = None
        else:
            loop = None
        others = [h for p, h in _Loop.others if p == pid]  # a forked child's copies count nobody of its own
    if loop is not None:
        _stop(loop, thread, handover)
    deadline = time.monotonic() + HANDOVER_SECONDS
    for h in others:
        h.wait_idle(deadline)


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread | None, handover: _HandOver | None) -> None:
    import asyncio
    import time

    async def drain() -> None:
        # Writes still under way (their waiter was interrupted by Ctrl-C) finish -- each is a
        # create-if-absent of a content-addressed object -- instead of being destroyed pending.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=10)
            for t in tasks:
                t.cancel()

    try:
        asyncio.run_coroutine_threadsafe(drain(), loop).result(timeout=15)
    except Exception:  # noqa: BLE001 - stopping the loop matters more than draining it
        pass
    loop.call_soon_threadsafe(loop.stop)
    if thread is not None:
        thread.join(timeout=5)
    if handover is not None:
        handover.refuse()
        handover.wait_idle(time.monotonic() + HANDOVER_SECONDS)
    if (thread is None or not thread.is_alive()) and not _Loop.remote_clients:
        # Closed here, not left to the loop's __del__: at teardown that can run after its
        # self-pipe socket was collected, and print a traceback ("Invalid file descriptor: -1").
        # Not where a remote client ran: its threads may still call back into the loop, which a
        # stopped loop tolerates and a closed one does not.
        try:
            loop.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass


def _started_executor(n: int) -> ThreadPoolExecutor:
    """A thread pool whose threads all exist already.

    Python 3.12 refuses to start threads while the interpreter shuts down, and
    the flush at exit still needs file I/O; a pool that never has to grow keeps
    working then.
    """
    from concurrent.futures import ThreadPoolExecutor  # registers an exit hook: a local folder never loads it

    ex = ThreadPoolExecutor(max_workers=n, thread_name_prefix="casmon-io-worker")
    barrier = threading.Barrier(n + 1)
    for _ in range(n):
        ex.submit(barrier.wait)  # each waits for the others, so the pool starts n threads
    barrier.wait()
    return ex


def submit(coro: Coroutine[Any, Any, T]) -> Future[T]:
    """Start a coroutine on casmon's loop; its ``concurrent.futures.Future``."""
    import asyncio

    return asyncio.run_coroutine_threadsafe(coro, get_loop())


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on casmon's loop and wait for its result."""
    import asyncio

    loop = get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:  # pragma: no cover - would deadlock
        raise RuntimeError("casmon's synchronous API was called from its own I/O thread")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


async def gather_limited(coros: Iterable[Coroutine[Any, Any, T]], limit: int) -> list[T]:
    """Await ``coros`` with at most ``limit`` running at once; their results in order."""
    import asyncio

    sem = asyncio.Semaphore(limit)

    async def one(c: Coroutine[Any, Any, T]) -> T:
        async with sem:
            return await c

    return list(await asyncio.gather(*(one(c) for c in coros)))
