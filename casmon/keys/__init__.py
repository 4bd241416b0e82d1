"""Keys: what names a value or a call, computed from content alone.

``digest`` (:class:`Digest`, 16 bytes of xxh3-128), ``fingerprint`` (the canonical,
type-tagged content hash of any value, and ``register_hasher``) and ``codeversion``
(the digest of a function's code and of the user code it reads). Nothing here
touches a store.
"""

from casmon.keys.digest import Digest
from casmon.keys.names import keep_flat_names

# Pickles and keys name these types where they were before the packages (casmon/keys/names.py).
keep_flat_names([Digest])

__all__ = ["Digest"]
