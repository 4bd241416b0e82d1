"""Drop-in replacements for the tools casmon grew out of: change one import.

* :mod:`casmon.compat.callmonitor` -- callmonitor 0.3.x's documented API.
* :mod:`casmon.compat.finecache` -- FineCache 0.1.x's documented API.
* :mod:`casmon.compat.mlflow` -- MLflow's fluent tracking API (``import casmon.compat.mlflow as mlflow``),
  its ``search_runs`` in :mod:`casmon.compat.mlflow_search`.

All keep their data in a casmon store, so they gain deduplication, packed
records, checked reads and the ``casmon`` command line.
"""
