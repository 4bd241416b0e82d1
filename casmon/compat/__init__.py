"""Drop-in replacements for the tools casmon grew out of: change one import.

* :mod:`casmon.compat.callmonitor` -- callmonitor 0.3.x's documented API.
* :mod:`casmon.compat.finecache` -- FineCache 0.1.x's documented API.

Both keep their data in a casmon store, so they gain deduplication, packed
records, checked reads and the ``casmon`` command line.
"""
