"""``python -m casmon``: the ``casmon`` command, for environments whose scripts are not on PATH."""

from casmon.cli.app import main

if __name__ == "__main__":
    main(prog_name="casmon")
