"""obstore's runtime threads hand each request's result to casmon's event loop by calling into Python; a process
that exits while one of them is still in there must not die.

Before Python 3.14, a thread that takes the GIL back once the interpreter finalizes is ended with
``pthread_exit``, whose unwinding cannot pass the Rust frames of obstore's threads: glibc aborts the whole
process (SIGABRT, nothing on stderr), after the script has done all its work. Real processes (the first on moto's
server); each child makes the hand-over slow (its GIL released, as the self-pipe write releases it), in the first
until the interpreter finalizes, so the old exit order aborts every time.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import run_python

LINGER = textwrap.dedent("""
    import asyncio, sys, threading, time, types
    import casmon
    from casmon.store.backend import loop as io_loop

    def lingering(ev_loop):
        real_write = ev_loop._write_to_self

        def write_then_linger():
            real_write()
            if isinstance(threading.current_thread(), threading._DummyThread):  # a thread Python did not start
                finalizing.wait(3)  # the GIL released until the interpreter finalizes (or 3 s)

        ev_loop._write_to_self = write_then_linger

    finalizing = threading.Event()
    {work}
    print("done", flush=True)

    class AtFinalization:
        # Deleted as the interpreter finalizes, with the modules: in one of its own, since a lingering thread's
        # frame keeps __main__'s names alive. It keeps what it calls: the names it would look up are cleared.
        def __init__(self):
            self.set, self.sleep = finalizing.set, time.sleep

        def __del__(self):
            self.set()
            self.sleep(2)  # time for a thread woken by the set to take the GIL back

    holder = types.ModuleType("casmon_test_at_finalization")
    holder.keep = AtFinalization()
    sys.modules[holder.__name__] = holder
    del holder
""")

#: Requests to S3 through casmon's own loop: a put and its flush.
STORE_WORK = """
s = casmon.open(sys.argv[1])
lingering(io_loop.get_loop())
s.put({"k": 1})
s.flush()
"""

#: An export to S3, whose requests zarr sends through its own loop.
EXPORT_WORK = """
from zarr.core.sync import sync

async def running_loop():
    return asyncio.get_running_loop()

s = casmon.open(sys.argv[2])
s.put({"k": 1})
lingering(sync(running_loop()))
s.export_zarr(sys.argv[1])
"""


@pytest.mark.parametrize("work", [STORE_WORK, EXPORT_WORK], ids=["store", "export"])
def test_a_process_whose_obstore_thread_is_still_handing_back_a_result_exits_cleanly(s3_env, tmp_path, work):
    env, bucket = s3_env
    code = LINGER.replace("{work}", work.strip())
    r = run_python(code, f"s3://{bucket}/linger", str(tmp_path / "local"), env=env, check=False)
    assert "done" in r.stdout, r.stderr[-2000:]
    assert r.returncode == 0, f"exit status {r.returncode}; stderr: {r.stderr[-2000:]!r}"


def test_the_exit_waits_for_a_thread_still_handing_a_result_to_the_loop():
    """shutdown() (the exit flush's last step) returns only once no thread is inside the loop's hand-over."""
    code = textwrap.dedent("""
        import threading, time
        from casmon.store.backend import loop as io_loop

        ev_loop = io_loop.get_loop()
        real_write = ev_loop._write_to_self
        inside, done = threading.Event(), []

        def slow_write():
            real_write()
            if threading.current_thread().name == "hander":
                inside.set()
                time.sleep(2)  # the GIL released, as obstore's thread would be in the self-pipe write
                done.append(True)

        ev_loop._write_to_self = slow_write
        threading.Thread(target=ev_loop.call_soon_threadsafe, args=(print, "ran"), name="hander", daemon=True).start()
        inside.wait(60)
        io_loop.shutdown()
        print("hand-over done at shutdown's return:", bool(done))
    """)
    r = run_python(code)
    assert "hand-over done at shutdown's return: True" in r.stdout, r.stdout + r.stderr[-2000:]


def test_a_result_handed_to_the_loop_after_the_exit_flush_raises_nothing():
    """A request abandoned at Ctrl-C may complete after shutdown(): its hand-over returns at once, touching
    neither the stopped (or closed) loop nor its self-pipe."""
    code = textwrap.dedent("""
        import threading
        from casmon.store.backend import loop as io_loop

        ev_loop = io_loop.get_loop()
        io_loop.shutdown()
        out = []

        def hand_over():
            try:
                out.append(ev_loop.call_soon_threadsafe(print, "ran"))
            except Exception as e:
                out.append(e)

        t = threading.Thread(target=hand_over)
        t.start()
        t.join(60)
        print("handed over:", out)
    """)
    r = run_python(code)
    assert "handed over: [None]" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "ran" not in r.stdout.replace("handed over", "")
