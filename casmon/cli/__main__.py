"""``python -m casmon.cli``: the ``casmon`` command."""

from casmon.cli.app import main

if __name__ == "__main__":
    main()
