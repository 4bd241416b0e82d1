"""Untrusted stores: looking never runs code, replay never calls what a record names, restore and export never
write VCS metadata, and nothing of a recorded process's secrets reaches the store (docs/SECURITY.md)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import casmon
from casmon.store.codec import decode_frame, split_pack
from tests.conftest import ROOT, run_python
from tests.support.git import git

# Builds the evil store in a process of its own: every pickle in it writes MARKER when it is loaded.
BUILD_EVIL = r'''
import sys, time
import casmon
from casmon.keys.fingerprint import fingerprint

store_path, marker = sys.argv[1], sys.argv[2]


class Evil:
    def __init__(self, tag):
        self.tag = tag

    def __reduce__(self):  # loading this pickle runs exec(...): it writes the marker file
        return (exec, (f"import pathlib; pathlib.Path({marker!r}).write_text({self.tag!r})",))


s = casmon.open(store_path, autoflush=None)

@casmon.intercept(store=s)
def train(data, opt=Evil("a function default")):
    return Evil("a result")

train(Evil("an argument"))
train([1, 2], opt=3)

@casmon.cache(store=s)
def features(x):
    return Evil("a cached result")

features(1)

evil = s.put(Evil("a value behind a ref"))
s.set_ref("shared/model", evil)
s.set_ref("gc/state", evil)  # casmon 0.1 kept gc's state as a pickle under this ref

# A call of os.system, its argument inline (no pickle): replay must never call it.
n = 99
s.create_ref(f"calllog/sessions/{n:06d}", None, {"argv": ["evil"]})
s.append("session", {"n": n, "start": 0.0, "pid": 1, "host": "h", "argv": [], "python": "3", "rank": None},
         key=fingerprint(("casmon.session", n)))
s.append("callfn", {"fn": "os.system", "session": n, "params": [["command", "POSITIONAL_OR_KEYWORD"]]},
         key=fingerprint(("casmon.callfn", "os.system", n)))
s.append("calls", {"session": n, "pid": 1, "rank": None, "fns": ["os.system"], "threads": {},
                   "c": [[0, 1, 0.0, 0.0, 0, ["touch " + marker], {}, 0, None]]})

hook = s.put(b"#!/bin/sh\ntouch " + marker.encode() + b"\n")
config = s.put(b"[core]\n\tfsmonitor = touch " + marker.encode() + b"\n")
fine = s.put(b"fine\n")
plain_patch = (b"diff --git a/.git/config b/.git/config\nnew file mode 100644\nindex 0000000..1111111\n"
               b"--- /dev/null\n+++ b/.git/config\n@@ -0,0 +1,2 @@\n+[core]\n+\tfsmonitor = touch " + marker.encode() + b"\n")
quoted_patch = (b'diff --git "a/\\056git/hooks/post-checkout" "b/\\056git/hooks/post-checkout"\nnew file mode 100755\n'
                b'index 0000000..1111111\n--- /dev/null\n+++ "b/\\056git/hooks/post-checkout"\n@@ -0,0 +1,2 @@\n'
                b"+#!/bin/sh\n+touch " + marker.encode() + b"\n")
rename_patch = (b"diff --git a/notes.txt b/.GIT/config\nsimilarity index 100%\nrename from notes.txt\nrename to .GIT/config\n")
base = {"casmon_run": 1, "prefix": "", "comment": "", "status": "ok", "start": time.time(), "end": time.time(),
        "duration": 1.0, "git": {"root": None, "in_git": False, "commit": None, "branch": None, "dirty": False,
                                  "untracked": [], "skipped": [], "notes": [], "patch": None},
        "files": {}, "argv": ["train.py"], "env": {}, "info": {}, "links": {"call_sessions": [], "cache": []}}

def run(n, **changes):
    m = dict(base, name=str(n), n=n, **changes)
    d = s.put(m)
    s.set_ref(f"runs/{n}", d, {"name": str(n), "status": "ok", "start": m["start"]})

run(1, files={".git/config": {"digest": config.hex(), "size": 10, "mode": 0o644},
              ".git/hooks/post-checkout": {"digest": hook.hex(), "size": 10, "mode": 0o755},
              "ok.txt": {"digest": fine.hex(), "size": 5, "mode": 0o644}},
    info={"model": {"$": evil.hex()}, "accuracy": 0.5})
run(2, git=dict(base["git"], patch=s.put(plain_patch).hex(), dirty=True))
run(3, git=dict(base["git"], patch=s.put(quoted_patch).hex(), dirty=True))
run(4, git=dict(base["git"], patch=s.put(rename_patch).hex(), dirty=True))
run(5, output=evil.hex())  # "console output" that is a pickle
run(6, info={"model": {"$": s.put(Evil("another info value")).hex()}})
s.set_ref("runs/7", s.put(Evil("a run manifest")), {"name": "7", "status": "ok", "start": time.time()})
s.close()
'''

# Every CLI command with default options, in one process of its own; prints one JSON line per command.
DRIVE_CLI = r'''
import json, sys
from click.testing import CliRunner
from casmon.cli.app import main

store, out = sys.argv[1], sys.argv[2]
commands = [
    ["stats"], ["stats", "--json"], ["verify"], ["verify", "--json"], ["cache"], ["calls"],
    ["calls", "train"], ["calls", "os.system", "--session", "99"], ["calls", "system"],
    ["show", "train", "1"], ["show", "train", "2"], ["show", "os.system", "1", "--session", "99"],
    ["runs"], ["runs", "--json"],
] + [["show", str(i)] for i in range(1, 8)] + [
    ["diff", "1", "6"], ["diff", "1", "2"], ["diff", "5", "6"], ["diff", "6", "7"],
    ["export", "1", out + "/export1"], ["export", "6", out + "/export6"], ["export", "7", out + "/export7"],
    ["restore", "1", out + "/restore1"], ["restore", "2", out + "/restore2"], ["restore", "3", out + "/restore3"],
    ["restore", "4", out + "/restore4"], ["restore", "7", out + "/restore7"],
    ["replay", "system", "1", "--session", "99"], ["replay", "train", "1"],
    ["gc", "--dry-run"], ["gc", "--dry-run", "--now"], ["cache", "clear", "features"],
]
runner = CliRunner()
for c in commands:
    r = runner.invoke(main, [*c, "--store", store])
    print(json.dumps({"cmd": c, "code": r.exit_code, "out": r.output,
                      "exc": None if r.exception is None or isinstance(r.exception, SystemExit) else repr(r.exception)}))
'''


@pytest.fixture(scope="module")
def evil(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evil")
    store, marker = tmp / "store", tmp / "MARKER"
    run_python(BUILD_EVIL, str(store), str(marker))
    assert store.exists() and not marker.exists()
    return store, marker


def _no_marker(marker: Path, what: str) -> None:
    assert not marker.exists(), f"{what} ran code from the store: {marker.read_text()!r}"


def test_every_cli_command_on_an_evil_store_runs_no_code(evil, tmp_path):
    store, marker = evil
    p = run_python(DRIVE_CLI, str(store), str(tmp_path))
    results = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(results) == 38
    _no_marker(marker, "the CLI")
    by = {" ".join(r["cmd"]): r for r in results}
    for cmd, r in by.items():
        assert r["exc"] is None, f"casmon {cmd} raised {r['exc']} (a traceback, not an error line):\n{r['out']}"
        assert "Traceback" not in r["out"], cmd
    # looking works and describes the pickles: their type read from the opcodes, never loaded
    for cmd in ["stats", "verify", "cache", "calls", "calls train", "show train 1", "runs", "show 1", "show 6",
                "diff 1 6", "export 6 " + str(tmp_path / "export6"), "gc --dry-run"]:
        assert by[cmd]["code"] in (0, 1 if cmd == "verify" else 0), (cmd, by[cmd]["out"])
    assert "builtins.exec" in by["calls"]["out"], "the default is described as a pickle that needs builtins.exec"
    assert "builtins.exec" in by["show train 1"]["out"] and "pickle" in by["show train 1"]["out"]
    assert "opt = 3" in by["show train 2"]["out"] and "data = [1, 2]" in by["show train 2"]["out"]
    assert "info model = <pickle builtins.exec" in by["show 1"]["out"]
    assert "accuracy = 0.5" in by["show 1"]["out"]
    info = json.loads((tmp_path / "export6" / "information.json").read_text())
    assert "builtins.exec" in info["model"], "export describes the pickled info value"
    assert "unreadable" in by["runs"]["out"] and "cannot read this run" in by["show 7"]["out"]
    # replay, restore and export refuse, with one clear line and exit status 1
    assert by["replay system 1 --session 99"]["code"] == 1 and "--import" in by["replay system 1 --session 99"]["out"]
    assert by["replay train 1"]["code"] == 1 and "--import" in by["replay train 1"]["out"]
    for n in ("1", "2", "3", "4"):
        r = by[f"restore {n} {tmp_path / ('restore' + n)}"]
        assert r["code"] == 1 and ("version-control" in r["out"]), (n, r["out"])
        assert not (tmp_path / ("restore" + n)).exists(), "refused before anything was written"
    assert by[f"export 1 {tmp_path / 'export1'}"]["code"] == 1 and "version-control" in by[f"export 1 {tmp_path / 'export1'}"]["out"]
    for r in (by[f"restore 7 {tmp_path / 'restore7'}"], by[f"export 7 {tmp_path / 'export7'}"], by["diff 6 7"]):
        assert r["code"] == 1 and "builtins.exec" in r["out"] and "--trust" not in r["out"].split("builtins.exec")[0][-5:]
    assert by["diff 5 6"]["code"] == 0, by["diff 5 6"]["out"]
    assert not list(tmp_path.rglob(".git")) and not list(tmp_path.rglob(".GIT")), "no VCS metadata was written"


def test_cli_processes_refuse_with_one_line(evil, tmp_path):
    from tests.cli.test_cli import cli

    store, marker = evil
    r = cli("replay", "system", "1", "--session", "99", "--store", str(store), check=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "--import" in r.stderr and "never imports" in r.stderr
    r = cli("--trust", "replay", "system", "1", "--session", "99", "--import", "json", "--store", str(store), check=False)
    assert r.returncode == 1 and "os.system is not in what --import named (json)" in r.stderr and "Traceback" not in r.stderr
    r = cli("restore", "3", str(tmp_path / "r3"), "--store", str(store), check=False)
    assert r.returncode == 1 and "version-control" in r.stderr and "Traceback" not in r.stderr
    _no_marker(marker, "the CLI")


def test_demo_on_an_evil_store_runs_no_code(evil, tmp_path):
    import shutil

    from tests.cli.test_cli import cli

    store, marker = evil
    shutil.copytree(store, tmp_path / "copy")
    out = cli("demo", "--store", str(tmp_path / "copy"), cwd=tmp_path).stdout
    assert "all equal to what went in" in out and "same result" in out
    _no_marker(marker, "casmon demo")


def test_every_public_read_api_on_an_evil_store_runs_no_code(evil, tmp_path):
    store_path, marker = evil
    from casmon.caching import cache_entries
    from casmon.compat import callmonitor

    for trust in (True, False):  # "looking" never unpickles, whatever the store's trust
        s = casmon.open(store_path, read_only=True, trust=trust)
        log = casmon.load(s)
        text = repr(log) + log._repr_html_() + log.signature("train") + repr(log.calls())
        assert "builtins.exec" in text and "os.system" in text
        for c in log.calls():
            repr(c), [log.describe_cell(x) for x in c.args_cells], log.describe_cell(c.result_cell)
            [log.peek_cell(x) for x in c.args_cells], log.peek_cell(c.result_cell)
        assert "train" in repr(callmonitor.DB(log))
        runs = casmon.list_runs(s)
        assert [r.name for r in runs][:6] == ["1", "2", "3", "4", "5", "6"] and runs[-1].status == "unreadable"
        for r in runs:
            repr(r), r.status, r.name, r.digest, r.info_peek() if r.error is None else None
        r1, r6 = casmon.load_run("1", s), casmon.load_run("6", s)
        d = casmon.diff(r1, r6)
        assert "model" in d["info"] and "builtins.exec" in repr(d["info"]["model"]["a"])
        assert "builtins.exec" in repr(r1.info_peek()["model"])
        assert r1.file("ok.txt") == b"fine\n" and b".git/config" in casmon.load_run("2", s).patch()
        with pytest.raises(casmon.UntrustedStoreError, match="builtins.exec"):
            casmon.load_run("5", s).output()  # casmon's own data never runs code, even in a trusted store
        with pytest.raises(casmon.UntrustedStoreError):
            casmon.diff("6", "7", store=s)
        for n in ("1", "2", "3", "4"):
            with pytest.raises(casmon.CasmonError, match="version-control"):
                casmon.restore(n, tmp_path / f"r{n}-{trust}", store=s)
        with pytest.raises(casmon.CasmonError, match="version-control"):
            casmon.export("1", tmp_path / f"e1-{trust}", store=s)
        casmon.export("6", tmp_path / f"e6-{trust}", store=s) if not trust else None
        with pytest.raises((LookupError, casmon.UntrustedStoreError), match="registered|trust=False"):
            log.replay("system", 1, session=99)
        with pytest.raises((LookupError, casmon.UntrustedStoreError), match="registered|trust=False"):
            log.replay("train", 1)
        s.stats(), s.verify(), cache_entries(s)
        for name in s.refs():
            s.get_ref(name)
        _no_marker(marker, f"a read API (trust={trust})")
    # loading a value is what trust=False refuses
    s = casmon.open(store_path, read_only=True, trust=False)
    log = casmon.load(s)
    for call in (lambda: log.get("train", 1), lambda: log.get_args("train", 1), lambda: log.result("train", 1),
                 lambda: casmon.load_run("1", s).info(), lambda: s.get(s.get_ref("shared/model").target)):
        with pytest.raises(casmon.UntrustedStoreError):
            call()
    assert log.get("train", 2) == ([[1, 2]], {"opt": 3}), "values that cannot run code still load"
    info = casmon.load_run("1", s).information()
    assert "builtins.exec" in info["model"] and info["accuracy"] == 0.5
    # a function the user names is called, with arguments that could not run code
    seen = []
    log.replay("system", 1, session=99, fn=lambda cmd: seen.append(cmd))
    assert seen == ["touch " + str(marker)]
    _no_marker(marker, "a read API with trust=False")


def test_gc_never_unpickles(evil, tmp_path):
    import shutil

    store_path, marker = evil
    copy = tmp_path / "copy"
    shutil.copytree(store_path, copy)
    s = casmon.open(copy, trust=True)  # even a trusting store: gc's state is data
    s.gc(dry_run=True)
    s.gc(grace=0)
    s.close()
    _no_marker(marker, "gc")


def test_trust_loads_pickles_on_the_command_line(tmp_path):
    """--trust is the way to load pickles from your own store: it works, and only with it."""
    from tests.cli.test_cli import cli

    run_python(textwrap.dedent("""
        import sys, casmon, fractions
        @casmon.intercept(store=sys.argv[1])
        def f(x, q=fractions.Fraction(1, 3)):
            return fractions.Fraction(x, 7)
        f(3)
    """), str(tmp_path / "s"))
    plain = cli("show", "f", "1", "--store", str(tmp_path / "s")).stdout
    assert "<pickle fractions.Fraction" in plain and "Fraction(3, 7)" not in plain
    for args in (["--trust", "show", "f", "1"], ["show", "f", "1", "--trust"]):
        out = cli(*args, "--store", str(tmp_path / "s")).stdout
        assert "result = Fraction(3, 7)" in out and "q = Fraction(1, 3)" in out
    assert "q=<pickle fractions.Fraction" in cli("calls", "--store", str(tmp_path / "s")).stdout


def test_damaged_calls_table_is_one_error_line(tmp_path):
    from tests.cli.test_cli import cli

    s = casmon.open(tmp_path / "s", autoflush=None)
    s.append("calls", {"session": 1, "fns": ["f"], "c": [[5, 1, 0.0, 0.0, 0, [], {}, None, None]]})  # index 5 of 1 name
    s.close()
    for args in (["calls"], ["calls", "f"], ["show", "f", "1"]):  # the malformed batch is left out, named once
        r = cli(*args, "--store", str(tmp_path / "s"), check=False)
        assert "Traceback" not in r.stderr and "record calls/" in r.stderr and "damaged" in r.stderr, r.stderr
    # a table file whose bytes are damaged: one line too
    l0 = next((tmp_path / "s" / "records" / "calls" / "l0").iterdir())
    data = bytearray(l0.read_bytes())
    data[-3] ^= 0xFF
    l0.write_bytes(bytes(data))
    r = cli("calls", "--store", str(tmp_path / "s"), check=False)
    # what can be read is shown; the damaged file is named on one warning line
    assert "Traceback" not in r.stderr and "damaged" in r.stderr and "verify --repair" in r.stderr, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr


SECRET_RUN = r'''
import os, sys, casmon

@casmon.intercept
def step(x):
    return x + 1


@casmon.intercept
def connect():
    raise RuntimeError("cannot reach " + os.environ["DATABASE_URL"] + " as " + os.environ["DB_PASSWORD"])

with casmon.record(comment="secrets", env=["MY_URL"], capture_output="fd") as run:
    step(1)
    print("connecting to", os.environ["DATABASE_URL"])  # a library that prints its URL
    print("argv was", sys.argv)
    run.info["ok"] = True
    try:
        connect()  # the call log keeps the exception's message
    except RuntimeError:
        pass
casmon.flush()
'''

SECRETS = ["hunter2-argv", "k3y-argv-value", "s3cr@t-pass", "tok-argv-123", "env-aws-secret-999", "ghp-env-token-777",
           "pa:ss@w/rd-db", "env-pass-5555", "conda-pw-4242", "myurl-pw-3131", "bearer-abcdef-9876"]


def test_no_secret_from_argv_or_environment_reaches_the_store(tmp_path):
    store = tmp_path / "s"
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_STORE=str(store),
               AWS_SECRET_ACCESS_KEY="env-aws-secret-999", GITHUB_TOKEN="ghp-env-token-777", DB_PASSWORD="env-pass-5555",
               DATABASE_URL="postgres://alice:pa:ss@w/rd-db@db.example.invalid/x",
               CONDA_DEFAULT_ENV="https://bob:conda-pw-4242@conda.example.invalid/env",
               MY_URL="https://carol:myurl-pw-3131@host.example.invalid/ x y")
    script = tmp_path / "job.py"
    script.write_text(SECRET_RUN)
    argv = [str(script), "--password", "hunter2-argv", "--api-key=k3y-argv-value",
            "https://carol:s3cr@t-pass@host.example.invalid/data", "TOKEN=tok-argv-123", "--db-pass", "env-pass-5555",
            "--header", "Authorization: Bearer bearer-abcdef-9876", "--lr", "0.1", "--max-tokens=512"]
    p = subprocess.run([sys.executable, *argv], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "hunter2-argv" in p.stdout, "the output shown on the terminal is untouched"
    blob = b"\n".join(_every_byte(store))
    leaked = [sec for sec in SECRETS if sec.encode() in blob]
    assert not leaked, f"secrets in the store: {leaked}"
    raw = b"".join(f.read_bytes() for f in store.rglob("*") if f.is_file())
    assert not [sec for sec in SECRETS if sec.encode() in raw]
    # what is kept is still useful
    assert b"--lr" in blob and b"0.1" in blob and b"--max-tokens=512" in blob and b"host.example.invalid" in blob
    s = casmon.open(store, read_only=True, trust=False)
    r = casmon.load_run("latest", s)
    assert r.manifest["argv"][1:4] == ["--password", "***", "--api-key=***"]
    assert r.manifest["env"]["MY_URL"].startswith("https://***@host") and "CONDA_DEFAULT_ENV" in r.manifest["env"]
    session = casmon.load(s).sessions[1]
    assert session["argv"][2] == "***" and "***@host.example.invalid" in session["argv"][4]


def _every_byte(store: Path):
    """Every object of a store, decompressed and checked: loose objects, pack entries, table files, refs."""
    for f in sorted(store.rglob("*")):
        if not f.is_file():
            continue
        rel = f.relative_to(store).as_posix()
        data = f.read_bytes()
        if rel == "casmon.json":
            yield data
        elif rel.startswith("packs/"):
            for off, ln, _h in split_pack(data, rel):
                yield bytes(decode_frame(data[off:off + ln], rel)[1])
        else:
            try:
                yield bytes(decode_frame(data, rel)[1])
            except casmon.DamagedObjectError:  # not a frame (a lock file, say): its bytes as they are
                yield data
