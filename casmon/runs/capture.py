"""Console capture for runs: stdout and stderr kept while still shown on the terminal.

``OutputCapture("python")`` tees ``sys.stdout`` and ``sys.stderr``.
``OutputCapture("fd")`` redirects file descriptors 1 and 2 through pipes, so
output of C extensions and subprocesses is captured too; reader threads copy
every byte to the original terminal as it comes.

The text is kept as a terminal would show it: within a line, a carriage
return starts the line over, so a progress bar that redraws itself a thousand
times leaves one line, not a thousand. At most ``limit`` bytes are kept: the
first and the last half, with a marker where the middle was dropped.
"""

from __future__ import annotations

import os
import sys
import threading
import time

__all__ = ["OutputCapture", "collapse_carriage_returns", "compact_carriage_returns"]

LIMIT = 64 << 20


def collapse_carriage_returns(text: str) -> str:
    """What a terminal shows: in each line, only what follows the last carriage return."""
    out = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if "\r" in line:
            parts = [p for p in line.split("\r")]
            # a bare trailing \r (redraw pending) keeps the last non-empty frame
            line = next((p for p in reversed(parts) if p), "")
        out.append(line)
    return "\n".join(out)


def compact_carriage_returns(text: str) -> str:
    """Each line with carriage returns as ``\\r`` + its last frame (+ ``\\r`` if it ended with one): what a
    terminal shows of it, still overwriting what came before it and overwritten by what follows."""
    if "\r" not in text:
        return text
    out = []
    for line in text.split("\n"):
        if "\r" in line:
            frames = line.split("\r")
            k = next((i for i in range(len(frames) - 1, -1, -1) if frames[i]), 0)
            # frame 0 goes on from the previous batch's line; a later frame starts the line over
            line = ("\r" if k else "") + frames[k] + ("\r" if line.endswith("\r") else "")
        out.append(line)
    return "\n".join(out)


class _Sink:
    """Keeps the head and the tail of what was written, within a byte budget."""

    def __init__(self, limit: int) -> None:
        self.half = max(1, limit // 2)
        self.head: list[str] = []
        self.head_len = 0
        self.tail: list[str] = []
        self.tail_len = 0
        self.dropped = 0
        self.lock = threading.Lock()
        # What was written since the last live batch (see take_live), up to ``limit`` in all.
        self.live: list[str] = []
        self.live_total = 0
        self.live_limit = limit
        self.live_stopped = False

    def write(self, s: str) -> None:
        with self.lock:
            if not self.live_stopped:
                self.live.append(s)
            if self.head_len < self.half:
                take = s[: self.half - self.head_len]
                self.head.append(take)
                self.head_len += len(take)
                s = s[len(take) :]
            if s:
                self.tail.append(s)
                self.tail_len += len(s)
                while self.tail_len > self.half and len(self.tail) > 1:
                    old = self.tail.pop(0)
                    self.tail_len -= len(old)
                    self.dropped += len(old)

    def take_live(self) -> str:
        """What was written since the last call, each redrawn line cut to its last frame. Batches join into
        the same text a terminal shows (``collapse_carriage_returns`` of their concatenation): a line's
        carriage returns are kept at its two ends, so a bar redrawn across two batches still shows once."""
        with self.lock:
            if self.live_stopped or not self.live:
                return ""
            text = "".join(self.live)
            self.live = []
            text = compact_carriage_returns(text)
            self.live_total += len(text)
            if self.live_total > self.live_limit:
                self.live_stopped = True
                text += (f"\n[casmon: live output stops here at {self.live_limit:,} characters; the run's head and "
                         "tail are kept when it ends]\n")
            return text

    def text(self) -> str:
        with self.lock:
            middle = f"\n[casmon: {self.dropped:,} characters of output dropped here]\n" if self.dropped else ""
            return "".join(self.head) + middle + "".join(self.tail)


class _Tee:
    def __init__(self, stream, sink: _Sink) -> None:
        self._stream = stream
        self._sink = sink

    def write(self, s) -> int:
        n = self._stream.write(s)
        self._sink.write(s if isinstance(s, str) else s.decode("utf-8", "replace"))
        return n

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (a pipe or terminal may take part of it, or ask to wait); drop it only on a real error."""
    view = memoryview(data)
    tries = 0
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            tries += 1
            if tries > 2000:
                return
            time.sleep(0.005)
            continue
        except OSError:
            return  # the terminal went away: the captured copy is still kept
        view = view[n:]


def _writes_to(stream, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except Exception:  # noqa: BLE001 - io.UnsupportedOperation, AttributeError, ...
        return False


class OutputCapture:
    """Capture stdout and stderr (``mode`` "python" or "fd") until :meth:`stop`."""

    def __init__(self, mode: str = "python", limit: int = LIMIT) -> None:
        if mode not in ("python", "fd"):
            raise ValueError(f"capture_output must be True, False, 'python' or 'fd', got {mode!r}")
        self.mode = mode
        self.sink = _Sink(limit)
        self._saved: list = []
        self._threads: list[threading.Thread] = []
        self._started = False

    def start(self) -> OutputCapture:
        self._py_saved = [sys.stdout, sys.stderr]
        if self.mode == "python":
            sys.stdout = _Tee(sys.stdout, self.sink)
            sys.stderr = _Tee(sys.stderr, self.sink)
        else:
            # Python streams that do not write to fd 1/2 (a notebook, a test runner) are teed as well.
            if not _writes_to(sys.stdout, 1):
                sys.stdout = _Tee(sys.stdout, self.sink)
            if not _writes_to(sys.stderr, 2):
                sys.stderr = _Tee(sys.stderr, self.sink)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001
                    pass
            for fd in (1, 2):
                saved = os.dup(fd)
                r, w = os.pipe()
                os.dup2(w, fd)
                os.close(w)
                t = threading.Thread(target=self._pump, args=(r, saved), name=f"casmon-capture-{fd}", daemon=True)
                t.start()
                self._saved.append((fd, saved, r))
                self._threads.append(t)
        self._started = True
        return self

    def _pump(self, r: int, out: int) -> None:
        decoder_buf = b""
        while True:
            try:
                chunk = os.read(r, 65536)
            except OSError:
                break
            if not chunk:
                break
            _write_all(out, chunk)
            data = decoder_buf + chunk
            try:
                text = data.decode("utf-8")
                decoder_buf = b""
            except UnicodeDecodeError as e:  # a character split across reads
                text = data[: e.start].decode("utf-8", "replace")
                decoder_buf = data[e.start :] if len(data) - e.start < 4 else b""
                if not decoder_buf:
                    text = data.decode("utf-8", "replace")
            self.sink.write(text)
        os.close(r)

    def stop(self) -> str:
        """Restore the streams and return the captured text (carriage returns collapsed)."""
        if not self._started:
            return ""
        self._started = False
        sys.stdout, sys.stderr = self._py_saved
        if self.mode == "fd":
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001
                    pass
            for fd, saved, _r in self._saved:
                os.dup2(saved, fd)  # closes the pipe's last write end: the reader sees EOF
            for t in self._threads:
                t.join(timeout=120)  # a busy machine may keep the reader waiting; it ends at EOF
            for _fd, saved, _r in self._saved:
                os.close(saved)  # only now: the reader copies what was left in the pipe to it
        return collapse_carriage_returns(self.sink.text())
