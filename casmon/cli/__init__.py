"""The ``casmon`` command line (click + rich): ``app`` holds the group, the ``*_verbs`` modules, ``import_verb``, ``demo`` and ``ui`` the verbs, ``options`` what they share."""

from casmon.cli.app import main

__all__ = ["main"]
