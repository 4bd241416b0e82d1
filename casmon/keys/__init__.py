"""Keys: what names a value or a call, computed from content alone.

``digest`` (:class:`Digest`, 16 bytes of xxh3-128), ``fingerprint`` (the canonical,
type-tagged content hash of any value, and ``register_hasher``) and ``codeversion``
(the digest of a function's code and of the user code it reads). Nothing here
touches a store.
"""

from casmon.keys.digest import Digest

__all__ = ["Digest"]
