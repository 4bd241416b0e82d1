"""A call that must end: run in a thread, so a hang fails its test instead of hanging the suite."""


def within(seconds: float, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a daemon thread: its value or its exception, or a failed test if it has not
    returned within ``seconds`` (a hang fails the test instead of hanging the suite)."""
    import threading

    box = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} did not return within {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def until(cond, what: str, timeout: float):
    """Poll ``cond()`` until it is truthy and return it; a failed test naming ``what`` after ``timeout`` seconds
    (bounds far beyond what must happen: a loaded machine is slow, not wrong)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
