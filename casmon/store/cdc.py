"""Content-defined chunking: cut a byte stream where its content says, so an insertion moves only nearby cuts.

Gear hashes (FastCDC's, as restic cuts with a rolling hash): ``h16(i) = sum(GEAR16[b[i-j]] << j for j < 16)``
mod 2**16 and ``h32(i) = sum(GEAR32[b[i-j]] << j for j < 32)`` mod 2**32, with two fixed random tables. Byte
``i`` is a *candidate* when ``h16(i)`` has its top 11 bits clear and ``h32(i)`` its top 8 (one byte in
2**19): it depends on the 32 bytes ending at ``i`` only. ``h16`` is computed for a whole block at once with
numpy (four shift-and-add passes on 16-bit numbers, doubling the window each time, instead of a Python
loop per byte), ``h32`` only at the one byte in 2,048 that passes ``h16``'s test: a 32-bit hash at every
byte, the plain way, cuts at half the speed (and is what content where many bytes pass ``h16``'s test
gets: long runs of one byte, a crafted pattern). A cut is the first candidate at least ``min_size`` after the
previous cut, or ``max_size`` after it when there is none. Candidates do not depend on where reading
started, so the cuts after an edit fall back onto the earlier ones within a piece or two. Measured against
the ``fastcdc`` package (docs/BENCHMARKS.md): its compiled build cuts an order of magnitude faster, its
pure-Python one several times slower, and it would bring four more dependencies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

import numpy as np

__all__ = ["MIN_SIZE", "AVG_SIZE", "MAX_SIZE", "MASK_BITS", "candidates", "Cutter", "pieces"]

MIN_SIZE = 512 << 10
MAX_SIZE = 8 << 20
#: A candidate is one byte in 2**19 (11 bits of ``h16``, 8 of ``h32``), so a piece averages
#: ``MIN_SIZE + 2**19`` = 1 MiB.
MASK_BITS = 19
AVG_SIZE = MIN_SIZE + (1 << MASK_BITS)
_WINDOW = 32
_BLOCK = 1 << 20  # bytes hashed at once: the hash arrays are 2 bytes a byte

# Fixed for all time: pieces of equal content must be cut equally by every casmon, Python and numpy version, so
# the tables are written out (little-endian; first drawn from numpy's PCG64, whose streams numpy may change).
_GEAR32 = np.frombuffer(bytes.fromhex(
    "a71abe27f150556dc4755f794ffac685245c6e8b891cd4b2bdaa2891b2936abb23d7b38719dc105193eab8ce08a2bda8b2e0b6fe"
    "a2fd5010d14aa2a7fc6a99871830c531b5a95dabb6925d9fd53d37096f3f617ae10668041b69d569632ac4234345abff3718112b"
    "1c0c267c9729fb5bedb11972d9b68a50777641ec9ccca6dc69089ce06e89d129413f83ddad7ec2b1ef40418bb6f3dd65803985e4"
    "08cec59c1af64ed9fc9c96755733795257666ea38573473e48bb114a8a6aaa34cd86c959b17c268c31dfff6369e5cb201b4ab937"
    "2093192e06f2979225d75325a359366be5eff496f0c7579d97d4cdb24a04e2d04b3da93ee489f519b920fb9b6f8b3261afca852d"
    "bfbc6161781dabf9f816b5aebfb635b69f971e9bebac434d20916a748ab46df62976b6b26018b7e4e67cdcd09f02a16dd6b43dce"
    "07549f5eecb79ba2816a757e72e5b5856580c03c984eaca4d0d0d82647b28cd2fe511ac80d45a1a8042a0ee32be8cc2a3b66df97"
    "4d828a09cb4e8e0f719da616c99bc9da40dc8faa96a1596d1fbf2c443eac3db39de38f5b959cfcc1c7bc57d0b6fac3ca858d5c2b"
    "5e8ab26c755e2ee30a4c4e1186aa76029457251ce8737c35c6cb5cafff2242de454311c88fb244a614a9a897d5e887a1bf5c6dbc"
    "027d2d266f23d4ad06e39e3ea5ded255b9eccf92280d9db837b3cd156d07657441ee64e6fabc71af6174ccd6fa5bc3aa5d9eafdc"
    "8a01c287001235b9d0daf3286c5728e77ac35522dc5e448621a8d6351a431227b1724e5a25acb51e509693a280921559e64c7020"
    "ca9b2d913a1d071fe78bfc47150dad3c6e867a43e4d75b8fdc2ebc7580a5953d96ebf8a76499ecdd0c088c836cd47859dcf7bf80"
    "3bc18b5c5edc87851ae98d610d1f5c36a5168445d2aaaf6e170914afa6a5004a9f365f2a437b78d1e313dee107718dcceaae8844"
    "4e8cb03640cef5e5239adfeb9e5ec97f566f6ae19195c01ca778963fcbfaef875a85c76cb2dfd972c95081f1bb19e19c90f3a0e9"
    "8b195c78262a6a7ae31cbe44edda5cad3436663d7e35d06b5c823be5ed368de9a18fc2ccfc691fd5b384e9c16bca0512684b350d"
    "22790686877f6b7565b0a37fc1a6c98c111ff7ee894dc35a0231c687196f2975e3a2c8d9be44f5ecd6c65b7d1439b33958e3465f"
    "8bd85e873a70d36362f846a300cac14231bee29261db280bb1c2b2ec8777de78a829731a1446f002c8edd2a08f69cc0fd0d86bb8"
    "6abcf8fc4f8689c15f84b415fe497508b5ba5f1e9a64fec79c8f9d15e605f10827e08dffd32783dbc422d14f6fc8395f39aca033"
    "76c41e19f4ceeb09456160a6d2040d9b81d580149d0154993f1bc5986500969c9c722b1f5cac03ebc132ff474d7c91751b2278ed"
    "c3b8be50158296805311d421478ca9136abaa0c73c3e79e1f1e7ffb255c1217b3a9bf6fc"
), dtype="<u4").astype(np.uint32)
_GEAR16 = np.frombuffer(bytes.fromhex(
    "16d64843fe8370db95d89f219b98a1a2368af7d7615a9b19ca7bfba98908c2e2da58c8b796a292388a224c60b410582f7d38c250"
    "d08cb1bf505239d747d782c8f1fee10163cebf5fa23e9acc0050bf2ea47bda5c6d571360bce3f86951f113782f1465b12229a2b9"
    "33e66b0698e7e70757c09a3c80efdbf5039853c72395ed750b33e009b354ed3589ee15cd0d1b86d2395ed58e53b0267f4e43346b"
    "d780e8fe561eafec9dd348f5fa2835f5bdc2a07f565b429055f2eff7e7f10b82e38b0a51c70be5ce88663a512f1ffa0f01655f82"
    "097c4d846c1e61be921f912efffd631260bdf51309420d7e1130c50b9cd85e279f5b82a6de8f3fb30efe5bab43dfb3b7fbfa5b11"
    "ad47ff94e5bade5cd625539bcbc9b31f776cb405d87336f0a7b4fcd57d1e40e4429376acf0e9d615224b2bfb6af32099e22b4ac4"
    "48ba7664e6a1c4ce12bb8ad1f80074324926ae14c4632bdb51e09956db18fd7b7a09783c786a96d1c6ecb81bc4b984ed30042efd"
    "ca85f8b8048856563e7e3b2572d77b878d31c95673750709551b58beb39b359f98cddaa0cab74b16f75d962ca65ef638be03b6d1"
    "495f525058aa477ca8bf67ce102ca52c56ca87db5b7218ec00756823be6b70429213e9aef7fb172f86741cdfef5f3eee6cd09667"
    "687d1208c5934bff02fc168f37f8b24fc2340233d7d7df45f67e894209306297b7daa1506de37c210dae781c"
), dtype="<u2").astype(np.uint16)
_BELOW16 = np.uint16(1 << (16 - 11))  # top 11 bits clear
_BELOW32 = np.uint32(1 << (32 - (MASK_BITS - 11)))  # top 8 bits clear
_SHIFTS = np.arange(_WINDOW, dtype=np.uint32)


def candidates(data: Any, context: bytes = b"") -> np.ndarray[Any, np.dtype[np.int64]]:
    """The offsets in ``data`` (a bytes-like) of the candidate bytes (a cut falls after one). ``context``: the
    bytes just before ``data`` (up to 31 are used), so a block's candidates are those of the whole stream;
    bytes before the stream's start count as absent (they add nothing to a hash)."""
    ctx = bytes(context[-(_WINDOW - 1):]) if context else b""
    buf = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    if ctx:
        buf = np.concatenate([np.frombuffer(ctx, dtype=np.uint8), buf])
    h = np.take(_GEAR16, buf)
    tmp = np.empty_like(h)
    shift = 1
    while shift < 16:  # h[i] sums the window of ``2*shift`` bytes ending at i
        np.left_shift(h[:-shift], shift, out=tmp[:-shift])
        np.add(h[shift:], tmp[:-shift], out=h[shift:])
        shift *= 2
    pre = np.flatnonzero(h < _BELOW16)
    del h, tmp
    if len(pre) > len(buf) >> 8:  # content many bytes pass (long runs, a crafted pattern): h32 everywhere
        h32 = np.take(_GEAR32, buf)
        shift = 1
        while shift < _WINDOW:
            h32[shift:] += h32[:-shift] << np.uint32(shift)
            shift *= 2
        pre = pre[h32[pre] < _BELOW32]
    elif len(pre):
        at = pre[:, None] - np.arange(_WINDOW)[None, :]  # the 32 bytes ending at each, newest first
        g = np.take(_GEAR32, buf[np.maximum(at, 0)])
        g[at < 0] = 0  # before the stream's start: absent
        pre = pre[(g << _SHIFTS).sum(axis=1, dtype=np.uint32) < _BELOW32]
    hits = pre.astype(np.int64) - len(ctx)
    return hits[hits >= 0]


class Cutter:
    """Cuts fed bytes into pieces as they come: :meth:`feed` returns the pieces complete so far, :meth:`end` the
    rest. Holds at most ``max_size`` plus one fed block, and the candidates in it as a numpy array: content
    where nearly every byte is a candidate (a crafted repeating pattern) costs 8 bytes a byte of the
    ``min_size`` it then cuts at, never a Python object per byte."""

    def __init__(self, min_size: int = MIN_SIZE, max_size: int = MAX_SIZE) -> None:
        if not 0 < min_size <= max_size:
            raise ValueError(f"casmon: chunking needs 0 < min_size <= max_size, got {min_size} and {max_size}")
        self.min_size, self.max_size = min_size, max_size
        self._buf = bytearray()  # bytes since the last cut
        self._cands: np.ndarray[Any, np.dtype[np.int64]] = np.empty(0, np.int64)  # offsets in _buf, ascending
        self._tail = b""  # the bytes before the block to come, for its hashes

    def feed(self, data: Any) -> list[bytes]:
        mv = memoryview(data).cast("B")
        out: list[bytes] = []
        for o in range(0, mv.nbytes, _BLOCK):
            block = mv[o:o + _BLOCK]
            self._cands = np.concatenate([self._cands, candidates(block, self._tail) + len(self._buf)])
            self._buf += block
            self._tail = bytes(self._buf[-(_WINDOW - 1):])
            out.extend(self._cut(final=False))
        return out

    def end(self) -> list[bytes]:
        return self._cut(final=True)

    def _cut(self, final: bool) -> list[bytes]:
        out: list[bytes] = []
        while self._buf:
            i = int(np.searchsorted(self._cands, self.min_size - 1))  # a cut falls after its candidate byte
            at = int(self._cands[i]) + 1 if i < len(self._cands) else None
            if at is None or at > self.max_size:
                if len(self._buf) < self.max_size and not final:
                    break  # a candidate may come yet
                at = min(self.max_size, len(self._buf))
            out.append(bytes(self._buf[:at]))
            del self._buf[:at]
            self._cands = self._cands[int(np.searchsorted(self._cands, at)):] - at
        return out


def pieces(f: IO[bytes], read_size: int = 4 << 20, min_size: int = MIN_SIZE, max_size: int = MAX_SIZE) -> Iterator[bytes]:
    """The pieces of the binary stream ``f``, read ``read_size`` bytes at a time."""
    c = Cutter(min_size, max_size)
    while True:
        block = f.read(read_size)
        if not block:
            break
        yield from c.feed(block)
    yield from c.end()
