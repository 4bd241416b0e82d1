"""The ``casmon`` command line (click + rich): ``app`` holds the commands, ``demo`` the demo, ``ui`` the ``ui`` and ``report`` verbs."""

from casmon.cli.app import main

__all__ = ["main"]
