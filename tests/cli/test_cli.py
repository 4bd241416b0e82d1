import json
import os
import subprocess
import sys

import numpy as np

import casmon
from casmon.store.objects import loose_key
from tests.conftest import ROOT


def cli(*args, cwd=None, check=True):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "casmon.cli", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"casmon {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def test_demo_then_stats_verify_gc(tmp_path, monkeypatch):
    """The demo in a process of its own, as typed; the verbs after it in this process (click's runner), each on
    the store of the current folder: a fresh interpreter for each cost more than the verbs themselves."""
    from click.testing import CliRunner

    from casmon.cli.app import main

    def here(*args):
        r = CliRunner().invoke(main, list(args), env={"CASMON_STORE": None})
        assert r.exit_code == 0, (args, r.output, r.exception)
        return r.stdout

    out = cli("demo", cwd=tmp_path).stdout
    assert "all equal to what went in" in out
    assert (tmp_path / ".casmon" / "casmon.json").exists()
    monkeypatch.chdir(tmp_path)
    st = json.loads(here("stats", "--json"))
    assert st["values"] >= 4 and st["dedup_ratio"] > 1.5
    assert "store is sound" in here("verify")
    rep = json.loads(here("gc", "--now", "--json"))
    assert rep["deleted_objects"] == 0, "the demo keeps its values with refs"
    out2 = " ".join(here("demo").split())
    assert "this demo added 0.0 MiB" in out2, "running it again stores nothing new"


def flip_first_chunk(store_path, value, at: int):
    """Flip one bit of the first chunk of a stored value; returns the chunk's digest."""
    chunk = next(casmon.open(store_path).manifest(value).chunk_digests())
    p = store_path / loose_key(chunk)
    data = bytearray(p.read_bytes())
    data[at] ^= 1
    p.write_bytes(bytes(data))
    return chunk


def test_verify_exit_status_on_damage(tmp_path):
    s = casmon.open(tmp_path / "s")
    d = s.put(np.random.default_rng(0).random(500_000))
    s.set_ref("x", d)
    s.close()
    chunk = flip_first_chunk(tmp_path / "s", d, at=100)
    r = cli("verify", "--store", str(tmp_path / "s"), check=False)
    assert r.returncode == 1
    assert chunk.hex() in r.stdout and "needed by ref x" in r.stdout
    j = json.loads(cli("verify", "--json", "--store", str(tmp_path / "s"), check=False).stdout)
    assert j["ok"] is False and len(j["damaged"]) == 1


def test_clear_errors(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = cli("stats", "--store", str(f), check=False)
    assert r.returncode != 0 and "is a file" in r.stderr and "Traceback" not in r.stderr
    r = cli("stats", "--store", str(tmp_path / "nothing-here"), check=False)
    assert r.returncode != 0 and "no such folder" in r.stderr


def test_store_from_environment(tmp_path):
    env_store = tmp_path / "envstore"
    s = casmon.open(env_store)
    s.set_ref("x", s.put(1))
    s.close()
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_STORE=str(env_store))
    p = subprocess.run([sys.executable, "-m", "casmon.cli", "stats", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(p.stdout)["refs"] == 1


def test_verify_repair(tmp_path):
    s = casmon.open(tmp_path / "s")
    good = s.put({"keep": 1})
    bad = s.put(np.random.default_rng(1).random(500_000))
    s.append("note", {"what": "needs the array"}, refs=[bad])
    s.set_ref("good", good)
    s.close()
    flip_first_chunk(tmp_path / "s", bad, at=50)
    r = cli("verify", "--repair", "--store", str(tmp_path / "s"))
    assert "repaired" in r.stdout and "store is sound" in r.stdout
    fresh = casmon.open(tmp_path / "s")
    assert fresh.get(good) == {"keep": 1} and bad not in fresh
    assert list(fresh.records("note")) == [], "the record that needed the damaged array is dropped"


def test_python_dash_m_casmon_is_the_cli(tmp_path):
    """``python -m casmon`` runs the CLI (``casmon/__main__.py``)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    s = casmon.open(tmp_path / "s")
    s.put([1, 2])
    s.close()
    p = subprocess.run([sys.executable, "-m", "casmon", "verify", "--store", str(tmp_path / "s")], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    h = subprocess.run([sys.executable, "-m", "casmon", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert h.returncode == 0 and h.stdout.startswith("Usage: casmon "), h.stdout


def test_text_from_the_store_that_looks_like_markup_is_shown_as_written(tmp_path):
    """A run's comment, a function's default and a recorded exception are the user's text, not rich markup:
    ``[/scratch/x]`` closed no tag and raised a traceback, ``[bold]x[/bold]`` lost its brackets."""
    (tmp_path / "work.py").write_text(
        "import casmon\n\n@casmon.intercept(store='s')\ndef f(x, tag='[bold]x[/bold]'):\n"
        "    if x < 0:\n        raise ValueError('bad [/] input')\n    return x\n")
    code = ("import casmon, work\nwork.f(1)\ntry:\n    work.f(-1)\nexcept ValueError:\n    pass\n"
            "with casmon.record(store='s', comment='data [/scratch/imagenet]', capture_output=False):\n    pass\n")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=120,
                   env=dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}"))
    shown = cli("show", "--store", "s", "latest", cwd=tmp_path).stdout
    assert "[/scratch/imagenet]" in shown
    assert "'[bold]x[/bold]'" in " ".join(cli("calls", "--store", "s", cwd=tmp_path).stdout.split())
    assert "bad [/] input" in cli("show", "--store", "s", "work.f", "2", cwd=tmp_path).stdout
    p = cli("calls", "--store", "s", "work.f", "--limit", "-1", cwd=tmp_path, check=False)
    assert p.returncode == 1 and "--limit" in p.stderr
