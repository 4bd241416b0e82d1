"""A generation's files as bytes, written: entries as columns, split into blocks of bucket files, and the
bloom filter. Writers and merges load it; a reader never does (:mod:`casmon.store.table.format` parses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from casmon.store.codec import KIND_TABLE, encode_frame
from casmon.store.table.format import (_COUNT, _LZ4, _MAGIC, BLOCK_ENTRIES, BLOOM_BITS_PER_KEY, BLOOM_K, MAX_BLOCKS,
                                       TableFile)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["Columns", "encode_v2"]


def _bloom(keys: npt.NDArray[np.uint8], nbits: int, k: int) -> bytes:
    """The bloom filter of ``keys`` (an ``(n, 16)`` uint8 array), probes as in :meth:`Generation.may_hold`."""
    import numpy as np  # merges and writes of generations: the reading side does without

    h1 = np.ascontiguousarray(keys[:, 8:16]).view("<u8").ravel()
    h2 = np.ascontiguousarray(keys[:, 4:8]).view("<u4").ravel().astype(np.uint64) | np.uint64(1)
    bits = np.zeros(nbits, dtype=bool)
    with np.errstate(over="ignore"):
        for i in range(k):
            bits[(h1 + np.uint64(i) * h2) % np.uint64(nbits)] = True
    return np.packbits(bits, bitorder="little").tobytes()


class Columns:
    """Table entries as columns, in order: 16-byte keys, and each value's start and length in one
    buffer. A merge of a million entries handles a few arrays instead of a million tuples."""

    __slots__ = ("keys", "starts", "lens", "buf")

    def __init__(self, keys: npt.NDArray[np.bytes_], starts: npt.NDArray[np.int64], lens: npt.NDArray[np.int64],
                 buf: bytes | memoryview) -> None:
        self.keys, self.starts, self.lens, self.buf = keys, starts, lens, buf

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def of_tables(cls, tables: list[TableFile]) -> Columns:
        """The entries of ``tables``, one table after the other, in their order (nothing dropped)."""
        import numpy as np

        bufs = [tf.vals for tf in tables if len(tf)]
        tables = [tf for tf in tables if len(tf)]
        if not tables:
            return cls(np.empty(0, "S16"), np.empty(0, np.int64), np.empty(0, np.int64), b"")
        base = np.cumsum([0] + [len(b) for b in bufs[:-1]])
        offs = [tf.offs.astype(np.int64) for tf in tables]
        return cls(np.concatenate([tf.keys for tf in tables]),
                   np.concatenate([o[:-1] + b0 for o, b0 in zip(offs, base.tolist())]),
                   np.concatenate([np.diff(o) for o in offs]),
                   b"".join(bufs))

    @classmethod
    def of_entries(cls, entries: list[tuple[bytes, bytes]]) -> Columns:
        import numpy as np

        lens = np.fromiter((len(v) for _, v in entries), dtype=np.int64, count=len(entries))
        starts = np.zeros(len(entries), np.int64)
        if len(entries) > 1:
            np.cumsum(lens[:-1], out=starts[1:])
        keys = np.frombuffer(b"".join(k.ljust(16, b"\0") for k, _ in entries), dtype="S16")
        return cls(keys, starts, lens, b"".join(v for _, v in entries))

    def value(self, i: int) -> bytes:
        s = int(self.starts[i])
        return bytes(self.buf[s : s + int(self.lens[i])])

    def take(self, order: np.ndarray) -> Columns:
        """The entries at ``order`` (an index array), sharing the buffer."""
        return Columns(self.keys[order], self.starts[order], self.lens[order], self.buf)

    def sorted_unique(self) -> Columns:
        """Sorted by key (stable), and each (key, value) pair once, where it first appears: what
        ``dict.fromkeys`` then a stable sort make of the same entries as tuples."""
        import numpy as np

        order = np.argsort(self.keys, kind="stable")
        out = self.take(order)
        same = np.flatnonzero(out.keys[1:] == out.keys[:-1]) + 1  # rows whose key is the previous row's
        if len(same):
            keep = np.ones(len(out), dtype=bool)
            seen: set[bytes] = set()
            prev = -2
            for p in same.tolist():  # runs of one key are rare and short: compare their values
                if p != prev + 1:
                    seen = {out.value(p - 1)}
                v = out.value(p)
                if v in seen:
                    keep[p] = False
                else:
                    seen.add(v)
                prev = p
            out = out.take(np.flatnonzero(keep))
        return out

    def entries(self) -> list[tuple[bytes, bytes]]:
        return [(k.ljust(16, b"\0"), self.value(i)) for i, k in enumerate(self.keys.tolist())]

    def table_file(self, lo: int, hi: int) -> bytes:
        """The payload of a table file of rows ``lo:hi`` (sorted already), as :func:`encode_table_file` makes it."""
        import numpy as np

        n = hi - lo
        offs = np.zeros(n + 1, dtype="<u8")
        lens = self.lens[lo:hi]
        np.cumsum(lens, out=offs[1:])
        buf = memoryview(self.buf) if not isinstance(self.buf, memoryview) else self.buf
        vals = b"".join([buf[st : st + ln] for st, ln in zip(self.starts[lo:hi].tolist(), lens.tolist())])
        return _COUNT.pack(_MAGIC, n) + self.keys[lo:hi].tobytes() + offs.tobytes() + vals


def encode_v2(entries: list[tuple[bytes, bytes]] | Columns, nb: int) -> tuple[list[bytes], bytes, dict[str, int]]:
    """A format-2 generation's bucket files, its directory and bloom filter, and manifest fields.

    Entries are split by the key's leading bits into blocks of about
    :data:`BLOCK_ENTRIES` (each one frame, checked on its own, so a lookup reads
    and checks one block); ``nb`` bucket files hold the blocks in order.
    """
    import numpy as np

    cols = entries if isinstance(entries, Columns) else Columns.of_entries(entries)
    n = len(cols)
    blocks = nb
    while blocks < MAX_BLOCKS and n / blocks > BLOCK_ENTRIES:
        blocks *= 2
    bits = blocks.bit_length() - 1
    nbits = max(64, (n * BLOOM_BITS_PER_KEY + 7) // 8 * 8)
    if n:
        if n > 1 and not bool(np.all(cols.keys[1:] >= cols.keys[:-1])):  # a merge's are sorted already
            cols = cols.take(np.argsort(cols.keys, kind="stable"))
        keys = np.frombuffer(cols.keys.tobytes(), dtype=np.uint8).reshape(n, 16)
        top = np.ascontiguousarray(keys[:, :4]).view(">u4").ravel().astype(np.int64) >> (32 - bits) if bits else np.zeros(n, np.int64)
        bounds = np.searchsorted(top, np.arange(blocks + 1)).tolist()
        bloom = _bloom(keys, nbits, BLOOM_K)
    else:
        bounds, bloom = [0] * (blocks + 1), bytes(nbits // 8)
    lens = np.zeros(blocks, dtype="<u4")
    per = blocks // nb
    files = []
    for i in range(nb):
        parts = []
        for b in range(i * per, (i + 1) * per):
            lo, hi = bounds[b], bounds[b + 1]
            if lo == hi:
                continue
            _, frame = encode_frame(cols.table_file(lo, hi), KIND_TABLE, _LZ4)
            lens[b] = len(frame)
            parts.append(frame)
        files.append(b"".join(parts))
    return files, lens.tobytes() + bloom, {"v": 2, "blocks": blocks, "bloom_bits": nbits, "bloom_k": BLOOM_K}
