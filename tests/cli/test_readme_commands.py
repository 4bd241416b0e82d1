"""Every verb and option the README's command list and its examples name exists, so a copied line runs."""

import re

import click

from casmon.cli.app import main
from tests.conftest import ROOT


def _readme_casmon_lines() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines += [ln.split("#", 1)[0] for ln in block.splitlines() if ln.startswith("casmon ")]
    return lines


def _verb(words: list[str]) -> tuple[str, click.Command]:
    ctx = click.Context(main)
    cmd = main.get_command(ctx, words[1])
    assert cmd is not None, f"the README names `casmon {words[1]}`, which is no verb"
    if isinstance(cmd, click.Group) and len(words) > 2 and words[2] in cmd.list_commands(ctx):
        return f"{words[1]} {words[2]}", cmd.get_command(ctx, words[2])
    return words[1], cmd


def test_every_verb_and_option_the_readme_names_exists():
    lines = _readme_casmon_lines()
    assert len(lines) > 30
    missing = []
    for line in lines:
        name, cmd = _verb(line.split())
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--trust", "--help", "-h"}
        for opt in re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", line):
            if opt not in known and not (name == "tag" and not opt.startswith("--")):  # `tag RUN +x -y`: changes
                missing.append(f"casmon {name} {opt}")
    assert not missing, f"options the README names that the verbs do not take: {missing}"
