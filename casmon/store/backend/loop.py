"""casmon's event loop: one asyncio loop on a daemon thread per process, and its thread pool.

zarr's stores are asynchronous and casmon's features synchronous, so every
zarr call runs on this loop and the caller waits for it (zarr's private
``sync`` helper is not used). After a ``fork`` the child makes a loop of its
own. A local folder never starts it: asyncio is imported on first use, not with
casmon.
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

__all__ = ["gather_limited", "get_loop", "note_remote_client", "run", "shutdown", "submit"]

T = TypeVar("T")

#: Worker threads for blocking I/O (zarr's LocalStore uses asyncio.to_thread).
WORKERS = 8


class _Loop:
    """The loop of this process, created on first use."""

    lock = threading.Lock()
    loop: asyncio.AbstractEventLoop | None = None
    pid: int = 0
    thread: threading.Thread | None = None
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
                loop.set_default_executor(_started_executor(WORKERS))
                from casmon.store import lifecycle

                lifecycle.exit_flush_before_pools()
                t = threading.Thread(target=loop.run_forever, name="casmon-io", daemon=True)
                t.start()
            except RuntimeError as e:  # the interpreter is exiting: no new thread, no new exit hook
                raise StoreError(f"casmon cannot start its I/O thread now ({e}): the interpreter is exiting, so a "
                                 "store that is not a local folder cannot be reached") from None
            _Loop.loop, _Loop.pid, _Loop.thread = loop, os.getpid(), t
        return _Loop.loop


def note_remote_client() -> None:
    """Say that a client with threads of its own (obstore's runtime, fsspec) was opened: its threads
    may call back into the loop after :func:`shutdown`, so the loop is stopped but never closed."""
    _Loop.remote_clients = True


def shutdown() -> None:
    """Stop the loop at interpreter exit, after the last flush.

    Clients with threads of their own (obstore's runtime) must not call back
    into a loop that Python is tearing down.
    """
    with _Loop.lock:
        loop, thread = _Loop.loop, _Loop.thread
        if loop is None or _Loop.pid != os.getpid():
            return
        _Loop.loop = None
    import asyncio

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
