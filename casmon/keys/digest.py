"""Digests: the 128-bit content addresses every object in casmon is known by.

A :class:`Digest` is 16 bytes of xxh3-128. It subclasses :class:`bytes` so it
is cheap to hash, compare and use as a dict key, and prints as 32 hex digits.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

if TYPE_CHECKING:
    import xxhash as xxhash
else:  # its C extension alone: the package's wrapper and version module are no part of a hit
    from casmon.keys.cext import extension_alone

    xxhash = extension_alone("xxhash._xxhash", ("xxh3_128", "xxh3_128_digest", "xxh3_128_hexdigest",
                                                "xxh3_64_hexdigest", "xxh3_64_intdigest"), "xxhash")

__all__ = ["Digest", "digest_bytes", "Hasher", "xxhash"]

Hasher = xxhash.xxh3_128

DIGEST_SIZE = 16


class Digest(bytes):
    """A 16-byte xxh3-128 content address."""

    __slots__ = ()

    def __new__(cls, value: bytes | str | Digest) -> Digest:
        if isinstance(value, Digest):
            return value
        if isinstance(value, str):
            try:
                raw = bytes.fromhex(value)
            except ValueError:
                raise ValueError(f"not a digest: {value!r} is not 32 hex digits") from None
        elif isinstance(value, int):  # bytes(10**12) would allocate a terabyte of zeros
            raise ValueError(f"not a digest: {value!r} is a {type(value).__name__}")
        else:
            raw = bytes(value)
        if len(raw) != DIGEST_SIZE:
            raise ValueError(f"not a digest: {value!r} must be {DIGEST_SIZE} bytes / 32 hex digits")
        return super().__new__(cls, raw)

    @classmethod
    def from_raw(cls, raw: bytes) -> Digest:
        """Wrap 16 bytes known to be a digest, without checks (hot paths)."""
        return bytes.__new__(cls, raw)

    @classmethod
    def parse(cls, value: str) -> Digest:
        """Parse 32 hex digits; a clear ValueError otherwise."""
        return cls(value)

    def __str__(self) -> str:
        return self.hex()

    def __repr__(self) -> str:
        return f"Digest('{self.hex()}')"

    @property
    def short(self) -> str:
        """The first 12 hex digits, for display."""
        return self.hex()[:12]


def digest_bytes(data: Any) -> Digest:
    """xxh3-128 of a bytes-like object, without copying it."""
    return bytes.__new__(Digest, xxhash.xxh3_128_digest(data))
