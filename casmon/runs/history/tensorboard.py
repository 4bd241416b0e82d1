"""TensorBoard event files read without TensorBoard: TFRecord frames, CRC32C checks (google_crc32c), and the few
protobuf messages that carry scalars and hparams.

casmon never imports tensorboard, tensorflow or protobuf: an event file is a
sequence of TFRecord frames (``length u64``, masked CRC32C of the length, the
data, masked CRC32C of the data), each data a serialized ``tensorboard.Event``.
Only what a scalar chart needs is decoded: ``Event.wall_time``/``step``/
``summary``/``session_log``, ``Summary.Value.tag`` with ``simple_value``
(``torch.utils.tensorboard``'s default, tensorboardX) or a rank-0 numeric
``tensor`` (``tensorboard.summary.Writer``, ``tf.summary.scalar``,
``add_scalar(new_style=True)``: ``float_val``, ``double_val``, ``int_val``,
... or ``tensor_content``), and the hparams plugin's session start and end
(``add_hparams``). Histograms, images, text and other plugins' data are counted
and left out.

TensorBoard's own rules are kept: a *run* is a folder holding event files, its
files read in name order (their names start with the writer's start time); a
``SessionLog START`` at step s (a job restarted from a checkpoint,
``SummaryWriter(purge_step=s)``) drops the points logged before it at steps
>= s. Both checksums of every record are checked; a damaged or truncated
record ends that file's reading with a :class:`HistoryWarning` and what was
read before it stays. A file whose first record is not a valid event is not an
event file: :class:`HistoryError`, naming it.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import struct
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from casmon.runs.history import HistoryError, HistoryWarning, RunHistory, metric_name_problem

__all__ = ["EVENT_FILE", "is_event_file", "run_id", "read_run", "read_path", "read_records", "masked_crc32c"]

#: How TensorBoard finds event files (``events.out.tfevents.<time>.<host>...``, any suffix).
EVENT_FILE = re.compile(r"^events\.out\.tfevents\.")
#: torch and TF name files ``events.out.tfevents.<time>.<host>.<pid>.<n>[.v2|suffix]``; hosts may hold dots.
_NAME_PARTS = re.compile(r"^events\.out\.tfevents\.(\d+)\.(.+?)\.(\d+)\.(\d+)(?:\..*)?$")


def is_event_file(name: str) -> bool:
    """Whether a file name is one TensorBoard reads as an event file."""
    return bool(EVENT_FILE.match(name))


# ---------------------------------------------------------------------------
# TFRecord frames
# ---------------------------------------------------------------------------

def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum of ``data``: its CRC32C (Castagnoli), rotated right by 15 bits, plus a constant."""
    from google_crc32c import value  # zarr's own dependency; loaded only when an event file is read

    return _mask(int(value(data)))


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path: Path) -> tuple[list[bytes], str | None]:
    """The data of every good record of an event file, and why reading stopped early (None: at its end).

    Records are read in order, both checksums of each checked, and reading
    stops at the first record that is truncated or fails a check.
    """
    if path.stat().st_size == 0:  # a writer that has not flushed yet (and mmap refuses an empty file)
        return [], None
    from google_crc32c import value as crc32c

    records: list[bytes] = []
    stop: str | None = None
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos, size = 0, len(mm)
        unpack = struct.unpack_from
        while pos < size:
            if pos + 12 > size:
                stop = f"a truncated record header at byte {pos}"
                break
            n, head_crc = unpack("<QI", mm, pos)
            if _mask(crc32c(mm[pos:pos + 8])) != head_crc:
                stop = f"a damaged record header at byte {pos}"
                break
            if pos + 16 + n > size:
                stop = f"a record at byte {pos} that is truncated or whose length is damaged"
                break
            data = mm[pos + 12:pos + 12 + n]
            if _mask(crc32c(data)) != unpack("<I", mm, pos + 12 + n)[0]:
                stop = f"a damaged record at byte {pos}"
                break
            records.append(data)
            pos += 16 + n
    return records, stop


# ---------------------------------------------------------------------------
# protobuf: just the fields read here
# ---------------------------------------------------------------------------

class _Malformed(Exception):
    """A record whose checksum is fine but whose bytes are not the message expected."""


def _varint(b: bytes, i: int) -> tuple[int, int]:
    """The varint at ``b[i:]`` and the offset after it (IndexError if ``b`` ends inside it)."""
    v = shift = 0
    while True:
        x = b[i]
        i += 1
        v |= (x & 0x7F) << shift
        if x < 0x80:
            return v, i
        shift += 7
        if shift > 63:
            raise _Malformed("a varint longer than 10 bytes")


def _fields(b: bytes) -> Iterator[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of a message: an int (varint), or bytes (fixed 64/32, length-delimited)."""
    i, end = 0, len(b)
    try:
        while i < end:
            key = b[i]
            if key < 0x80:  # field numbers below 16: one byte, the common case
                i += 1
            else:
                key, i = _varint(b, i)
            wt = key & 7
            if wt == 0:
                v, i = _varint(b, i)
                yield key >> 3, 0, v
            elif wt == 1:
                if i + 8 > end:
                    raise _Malformed("a truncated 64-bit field")
                yield key >> 3, 1, b[i:i + 8]
                i += 8
            elif wt == 2:
                n, i = _varint(b, i)
                if i + n > end:
                    raise _Malformed("a truncated length-delimited field")
                yield key >> 3, 2, b[i:i + n]
                i += n
            elif wt == 5:
                if i + 4 > end:
                    raise _Malformed("a truncated 32-bit field")
                yield key >> 3, 5, b[i:i + 4]
                i += 4
            else:
                raise _Malformed(f"wire type {wt}")
    except IndexError:
        raise _Malformed("a truncated varint") from None


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _varints(b: bytes) -> list[int]:
    """A packed repeated varint field."""
    return [v for _f, _w, v in _fields(_as_varint_message(b))]


def _as_varint_message(packed: bytes) -> bytes:
    """A packed varint list read through :func:`_fields`: each varint given field 1, wire type 0."""
    out = bytearray()
    start = 0
    for i, c in enumerate(packed):
        if c < 0x80:
            out += b"\x08" + packed[start:i + 1]
            start = i + 1
    if start != len(packed):
        raise _Malformed("a truncated packed varint")
    return bytes(out)


#: TensorFlow's DataType -> (numpy dtype of tensor_content, TensorProto field of its values, how it is packed)
_DTYPES: dict[int, tuple[str, int, str]] = {
    1: ("<f4", 5, "f4"), 2: ("<f8", 6, "f8"), 3: ("<i4", 7, "v"), 4: ("u1", 7, "v"), 5: ("<i2", 7, "v"),
    6: ("i1", 7, "v"), 9: ("<i8", 10, "v"), 10: ("?", 11, "v"), 17: ("<u2", 7, "v"), 19: ("<f2", 13, "v"),
    14: ("bf16", 13, "v"), 22: ("<u4", 16, "v"), 23: ("<u8", 17, "v"),
}


def _tensor_scalar(b: bytes) -> float | None:
    """The value of a rank-0 numeric TensorProto, or None if the tensor is anything else."""
    dtype, content, rank = 0, None, 0
    vals: dict[int, list[bytes | int]] = {}
    for f, w, v in _fields(b):
        if f == 1 and w == 0:
            dtype = v
        elif f == 2 and w == 2:
            rank = sum(1 for df, _w, _v in _fields(v) if df == 2)
        elif f == 4 and w == 2:
            content = v
        elif 5 <= f <= 17:
            vals.setdefault(f, []).append(v)
    spec = _DTYPES.get(dtype)
    if spec is None or rank != 0:
        return None
    np_dtype, field, packing = spec
    if content:
        if np_dtype == "bf16":
            return _bfloat16(int(np.frombuffer(content, "<u2")[0])) if len(content) == 2 else None
        arr = np.frombuffer(content, np_dtype)
        return float(arr[0]) if arr.size == 1 else None
    items = vals.get(field)
    if not items:
        return None
    raw = items[-1]
    if packing in ("f4", "f8"):
        size = int(packing[1])
        data = raw if isinstance(raw, bytes) else b""
        if len(data) != size:  # packed: one element only for a scalar
            return None
        return float(np.frombuffer(data, "<" + packing)[0])
    ints = _varints(raw) if isinstance(raw, bytes) else [raw]
    if len(ints) != 1:
        return None
    x = ints[0]
    if dtype == 19:  # half and bfloat16 keep their 16 bits in an int32
        return float(np.array([x & 0xFFFF], dtype=np.uint16).view(np.float16)[0])
    if dtype == 14:
        return _bfloat16(x & 0xFFFF)
    if dtype in (3, 5, 6, 9):
        return float(_int64(x))
    return float(x)


def _bfloat16(bits: int) -> float:
    """A bfloat16 from its 16 bits: the high half of a float32."""
    return float(struct.unpack("<f", struct.pack("<I", bits << 16))[0])


def _plugin(b: bytes) -> tuple[str, bytes]:
    """``SummaryMetadata`` -> (plugin name, plugin content)."""
    for f, w, v in _fields(b):
        if f == 1 and w == 2:
            name, content = "", b""
            for pf, pw, pv in _fields(v):
                if pf == 1 and pw == 2:
                    name = pv.decode("utf-8", "replace")
                elif pf == 2 and pw == 2:
                    content = pv
            return name, content
    return "", b""


def _struct_value(b: bytes) -> Any:
    """A ``google.protobuf.Value`` as plain Python."""
    for f, w, v in _fields(b):
        if f == 1:
            return None
        if f == 2 and w == 1:
            return struct.unpack("<d", v)[0]
        if f == 3 and w == 2:
            return v.decode("utf-8", "replace")
        if f == 4 and w == 0:
            return bool(v)
        if f == 5 and w == 2:
            return dict(_map_entries(v))
        if f == 6 and w == 2:
            return [_struct_value(x) for lf, lw, x in _fields(v) if lf == 1 and lw == 2]
    return None


def _map_entries(b: bytes) -> Iterator[tuple[str, Any]]:
    """The entries of a ``map<string, Value>`` (field 1 of a Struct)."""
    for f, w, entry in _fields(b):
        if f == 1 and w == 2:
            yield _map_entry(entry)


def _map_entry(entry: bytes) -> tuple[str, Any]:
    """One map entry: key (field 1), ``google.protobuf.Value`` (field 2)."""
    key, value = "", None
    for f, w, v in _fields(entry):
        if f == 1 and w == 2:
            key = v.decode("utf-8", "replace")
        elif f == 2 and w == 2:
            value = _struct_value(v)
    return key, value


#: hparams' SessionEndInfo.status -> casmon's status (STATUS_RUNNING: nobody writes it any more, so lost).
_HPARAMS_STATUS = {0: "ok", 1: "ok", 2: "failed", 3: "lost"}


#: Summary.Value's fields of the data kinds before tensors (TF1, tensorboardX, torch's histograms and images).
_OLD_KINDS = {3: "histograms", 4: "images", 5: "histograms", 6: "audio"}


class _Run:
    """What the events of one folder add up to."""

    def __init__(self) -> None:
        self.points: dict[str, tuple[list[int], list[float], list[float]]] = {}
        self.plugin: dict[str, str] = {}  # a tag's plugin, from the first event that says it
        self.other: dict[str, int] = {}  # values of other plugins left out, by plugin
        self.params: dict[str, Any] = {}
        self.hparams: dict[str, Any] = {}
        self.status = "ok"
        self.end_hint: float | None = None
        self.first: float | None = None
        self.last: float | None = None
        self.purged = 0

    def event(self, data: bytes) -> None:
        wall, step, summary, session_start = 0.0, 0, None, False
        for f, w, v in _fields(data):
            if f == 1 and w == 1:
                wall = struct.unpack("<d", v)[0]
            elif f == 2 and w == 0:
                step = _int64(v)
            elif f == 5 and w == 2:
                summary = v
            elif f == 7 and w == 2:
                session_start = any(sf == 1 and sw == 0 and sv == 1 for sf, sw, sv in _fields(v))
        if wall:
            self.first = wall if self.first is None else min(self.first, wall)
            self.last = wall if self.last is None else max(self.last, wall)
        if session_start:
            self.purge(step)
        if summary is not None:
            for f, w, v in _fields(summary):
                if f == 1 and w == 2:
                    self.value(v, step, wall)

    def purge(self, step: int) -> None:
        """TensorBoard's restart rule: points logged before a SessionLog START at steps >= its step go."""
        for tag, (steps, values, times) in self.points.items():
            keep = [i for i, s in enumerate(steps) if s < step]
            if len(keep) != len(steps):
                self.purged += len(steps) - len(keep)
                self.points[tag] = ([steps[i] for i in keep], [values[i] for i in keep], [times[i] for i in keep])

    def value(self, b: bytes, step: int, wall: float) -> None:
        tag, simple, tensor, meta = "", None, None, None
        other = ""
        for f, w, v in _fields(b):
            if f == 1 and w == 2:
                tag = v.decode("utf-8", "replace")
            elif f == 2 and w == 5:
                simple = struct.unpack("<f", v)[0]
            elif f == 8 and w == 2:
                tensor = v
            elif f == 9 and w == 2:
                meta = v
            elif f in _OLD_KINDS:
                other = _OLD_KINDS[f]
        plugin, content = _plugin(meta) if meta is not None else ("", b"")
        if plugin:
            self.plugin.setdefault(tag, plugin)
        plugin = self.plugin.get(tag, "")
        if plugin == "hparams":
            self.hparams_value(tag, content)
            return
        x: float | None = None
        if simple is not None:
            x = simple
        elif tensor is not None and plugin in ("", "scalars"):
            x = _tensor_scalar(tensor)
        if x is None:
            if other or tensor is not None or plugin:
                kind = plugin or other or "tensors"
                self.other[kind] = self.other.get(kind, 0) + 1
            return
        p = self.points.get(tag)
        if p is None:
            p = self.points[tag] = ([], [], [])
        p[0].append(step)
        p[1].append(x)
        p[2].append(wall)

    def hparams_value(self, tag: str, content: bytes) -> None:
        for f, w, v in _fields(content):
            if f == 3 and w == 2:  # SessionStartInfo
                for sf, sw, sv in _fields(v):
                    if sf == 1 and sw == 2:
                        key, value = _map_entry(sv)
                        self.params[key] = value
                    elif sf in (2, 3, 4) and sw == 2 and sv:
                        self.hparams[{2: "model_uri", 3: "monitor_url", 4: "group_name"}[sf]] = sv.decode(
                            "utf-8", "replace")
            elif f == 4 and w == 2:  # SessionEndInfo
                for ef, ew, ev in _fields(v):
                    if ef == 1 and ew == 0:
                        self.status = _HPARAMS_STATUS.get(ev, "ok")
                    elif ef == 2 and ew == 1:
                        t = struct.unpack("<d", ev)[0]
                        self.end_hint = t if t > 0 else None


def _file_order(p: Path) -> tuple[int, str]:
    m = _NAME_PARTS.match(p.name)
    return (int(m.group(1)) if m else 0, p.name)


def read_run(folder: Path, files: list[Path], root: Path) -> RunHistory | None:
    """One TensorBoard run: the events of ``files`` (event files of ``folder``), named by ``folder``'s path
    under ``root``. None when they hold no scalar and no hparams. A file that is not an event file raises
    :class:`HistoryError`; a damaged record later in a file warns and keeps what came before."""
    run = _Run()
    notes: list[str] = []
    files = sorted(files, key=_file_order)
    host: str | None = None
    pids: list[int] = []
    for path in files:
        try:
            records, stop = read_records(path)
        except OSError as e:
            raise HistoryError(f"{path}: cannot read this event file ({e.strerror or e})") from None
        if stop is not None and not records:
            raise HistoryError(f"{path}: not a TensorBoard event file ({stop}: its checksum does not match)")
        for i, data in enumerate(records):
            try:
                run.event(data)
            except _Malformed as e:
                if i == 0:
                    raise HistoryError(f"{path}: not a TensorBoard event file (its first record is not an event: "
                                       f"{e})") from None
                stop = f"record {i} is not an event ({e})"
                break
        if stop is not None:
            note = f"{path}: reading stopped at {stop}; the {len(records)} record(s) before it are imported"
            warnings.warn(note, HistoryWarning, stacklevel=2)
            notes.append(note)
        m = _NAME_PARTS.match(path.name)
        if m:
            host = host or m.group(2)
            pids.append(int(m.group(3)))
    metrics: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
    for tag, (steps, values, times) in sorted(run.points.items()):
        problem = metric_name_problem(tag)
        if problem:
            notes.append(f"{folder}: tag {tag[:80]!r} not imported: {problem}")
            continue
        if steps:
            metrics[tag] = (np.array(steps, dtype=np.int64), np.array(values, dtype=np.float64),
                            np.array(times, dtype=np.float64))
    if not metrics and not run.params:
        return None
    if run.other:
        notes.append(f"{folder}: not imported (not scalars): " + ", ".join(
            f"{n} {kind} value(s)" for kind, n in sorted(run.other.items())))
    if run.purged:
        notes.append(f"{folder}: {run.purged} point(s) dropped as TensorBoard does: logged before a restart "
                     "(SessionLog START) at the steps it restarted from")
    start = run.first if run.first is not None else min(float(t[0]) for _s, _v, t in metrics.values())
    end = run.end_hint or run.last
    rel = folder.relative_to(root).as_posix() if folder != root and folder.is_relative_to(root) else folder.name
    ident = run_id(files)
    info: dict[str, Any] = {"tensorboard": {"run": rel, "folder": str(folder), "files": [p.name for p in files]}}
    if pids:
        info["tensorboard"]["pids"] = sorted(set(pids))
    if run.hparams:
        info["tensorboard"]["hparams"] = run.hparams
    return RunHistory(tool="tensorboard", id=ident, path=str(folder), name=rel, start=start, end=end,
                      status=run.status, params=run.params, info=info, metrics=metrics, host=host, notes=notes)


def run_id(files: list[Path]) -> str:
    """A TensorBoard run's identity: a digest of its event files' names (each names its writer's start time,
    host, process and counter), so a copy of a log folder is the same run and a resumed run is a new one."""
    return hashlib.blake2b("\n".join(sorted(p.name for p in files)).encode(), digest_size=16).hexdigest()


def read_path(path: str | os.PathLike[str]) -> list[RunHistory]:
    """Every TensorBoard run at ``path``: one event file (a run of that file alone), or a folder searched for
    event files (a run per folder holding some; see :func:`casmon.runs.history.scan`)."""
    from casmon.runs.history import scan

    found = scan(path)
    root = found.root.parent if found.root.is_file() else found.root
    runs = [read_run(folder, files, root) for folder, files in sorted(found.event_folders.items())]
    return [r for r in runs if r is not None]
