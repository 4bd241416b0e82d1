"""The metadata damage campaign: each file the store trusts as JSON or metadata -- gc's fence, lock, lease,
lock-break claim and condemned list, a compute claim, run refs, ``casmon.json`` -- damaged each way (bit
flips of each bit class, truncation, zeroes, deep JSON, huge numbers, wrong types; crafted payloads inside
sound frames where the file is framed). For each case: every acknowledged cache entry is still found by a
fresh store, survives two gc runs (after ``verify --repair`` where gc refuses), ``verify`` names the file
whenever its content cannot be read, and the CLI's verbs, run in-process, end in casmon's one-line error at
worst, never a traceback. The default run damages each file in each way once; ``--runslow`` flips every bit
class at many places of every file (figures in docs/RELIABILITY.md)."""

import json
import random
import shutil
import struct
import time
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

import casmon
from casmon.cli.app import main
from casmon.errors import StoreDamageWarning
from casmon.maintenance import repair
from casmon.store import metafile
from casmon.store.codec import KIND_REF, KIND_TABLE, decode_frame, encode_frame, get_codec
from casmon.store.condemned import decode as decode_condemned
from casmon.store.marker import parse_marker
from casmon.store.records import decode_ref
from casmon.store.table import fence
from tests.support.damage import flip_at

N = 24
DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE = (b'{"time": 1e999, "lease": 1e999, "count": 1' + b"0" * 5000 + b', "entries": 1e400, "packs": [], '
        b'"seen": {}, "format": 1e999, "target": null, "data": {"pid": 1' + b"0" * 5000 + b"}}")
WRONG = b'{"time": "x", "lease": [1], "seen": [], "count": "z", "entries": {}, "packs": 3, "format": "2", "data": []}'
HOWS = ["flip", "truncate", "zero", "deep", "huge", "wrong type", "not an object"]
VERBS = [["verify"], ["stats"], ["cache"], ["calls"], ["runs"], ["show", "1"], ["gc", "--dry-run"], ["gc", "--now"]]


def square(i):
    return [i] * 30


def build(root: Path) -> None:
    s = casmon.open(root, autoflush=None)
    sq = casmon.cache(store=s)(square)
    with casmon.record(comment="damage", store=s, capture_output=False):
        for i in range(N):
            sq(i)
            if i % 8 == 7:
                s.flush()
    s.put(list(range(3000)))  # garbage: gc sweeps it, publishing its fence first
    s.flush()
    s.gc(grace=0)
    s.put(list(range(4000)))  # garbage gc condemns: a condemned list
    s.flush()
    s.gc(grace=3600)
    s.create_ref("claims/" + "ab" * 16, None, {"pid": 1, "token": "t0", "beat": 3, "every": 15.0, "time": time.time()})
    s.close()
    # What a dead holder of the store lock leaves: the lock, its lease, a claim to break it.
    dead = {"what": "gc", "host": "elsewhere", "boot": "", "pidns": "", "pid": 1, "start": "", "time": 1.0,
            "lease": 120.0, "nonce": "00ff00ff00ff00ff"}
    (root / "gc" / "lock").write_bytes(json.dumps(dead).encode())
    (root / "gc" / "lock-lease").mkdir()
    (root / "gc" / "lock-lease" / "00ff00ff00ff00ff").write_bytes(b'{"time": 2.0, "n": 1}')
    (root / "gc" / "lock-broken").mkdir()
    (root / "gc" / "lock-broken" / ("cd" * 16 + "-0")).write_bytes(json.dumps(dead).encode())


FILES = {  # kind -> (glob, framed as: None, "ref" or "condemned")
    "gc fence": ("gc/fence/*", None),
    "gc lock": ("gc/lock", None),
    "gc lock lease": ("gc/lock-lease/*", None),
    "gc lock-break claim": ("gc/lock-broken/*", None),
    "condemned list": ("gc/condemned/*", "condemned"),
    "compute claim": ("refs/claims/*", "ref"),
    "run ref": ("refs/runs/**/*", "ref"),
    "casmon.json": ("casmon.json", None),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("meta") / "s"
    build(root)
    for kind, (pattern, _f) in FILES.items():
        assert [p for p in root.glob(pattern) if p.is_file()], kind
    return root


def frame(kind: str | None, payload: bytes) -> bytes:
    """A crafted payload as the file would hold it, in a sound frame where the file is framed."""
    if kind == "ref":
        return encode_frame(payload, KIND_REF, get_codec("none"))[1]
    if kind == "condemned":
        return encode_frame(b"CDL1" + struct.pack("<I", len(payload)) + payload, KIND_TABLE, get_codec("zstd"))[1]
    return payload


def damaged(data: bytes, how: str, framed: str | None, rng: random.Random) -> bytes:
    if how == "flip":
        return flip_at(data, rng.randrange(len(data)), 1 << rng.randrange(8))[0]
    if how == "truncate":
        return data[: rng.randrange(len(data))]
    if how == "zero":
        return bytes(len(data))
    payload = {"deep": DEEP, "huge": HUGE, "wrong type": WRONG, "not an object": b'["x", 1]'}[how]
    return frame(framed, payload)


def unreadable(rel: str, data: bytes, framed: str | None) -> bool:
    """True if the damaged file cannot be read as what it is (verify must name it then)."""
    try:
        if rel.startswith("gc/fence/"):
            fence.parse(rel, data)
        elif rel == "casmon.json":
            return parse_marker(data)[1] is not None
        elif framed == "ref":
            decode_ref(rel[5:], rel, data)
        elif framed == "condemned":
            decode_condemned(rel.rsplit("/", 1)[-1], data)
        else:
            metafile.load_object(data, rel)
    except casmon.DamagedObjectError:
        return True
    return False


def found(root: Path) -> int:
    s = casmon.open(root, read_only=True)
    sq = casmon.cache(store=s)(square)
    n = 0
    for i in range(N):
        try:
            n += sq.lookup(i) == [i] * 30
        except KeyError:
            pass
    return n


def run_cli(root: Path, rel: str, how: str) -> None:
    runner = CliRunner()
    for verb in VERBS:
        r = runner.invoke(main, [*verb, "--store", str(root)])
        where = (rel, how, verb, r.output[-600:])
        assert r.exception is None or isinstance(r.exception, SystemExit), (*where, repr(r.exception))
        assert "Traceback" not in r.output, where
        if r.exit_code and verb != ["verify"]:  # verify's report of damage exits 1 too
            assert sum(line.startswith("Error:") for line in r.output.splitlines()) == 1, where


def one_case(pristine: Path, tmp_path: Path, kind: str, how: str, seed: int, figures, cli: bool = True) -> None:
    pattern, framed = FILES[kind]
    root = tmp_path / f"{kind.replace(' ', '-')}-{how.replace(' ', '-')}-{seed}"
    shutil.copytree(pristine, root)
    rng = random.Random(f"{kind}{how}{seed}")
    victim = rng.choice(sorted(p for p in root.glob(pattern) if p.is_file()))
    rel = victim.relative_to(root).as_posix()
    bad = damaged(victim.read_bytes(), how, framed, rng)
    victim.write_bytes(bad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreDamageWarning)
        assert found(root) == N, (rel, how)
        w = casmon.open(root)  # a cached call that computes, and its flush (and merge), on the damaged store
        assert casmon.cache(store=w)(square)(N) == [N] * 30
        w.close()
        rep = casmon.open(root).verify()
        if unreadable(rel, bad, framed):
            assert any(k == rel or k.startswith(rel) for k, _ in rep.damaged), (rel, how, rep.damaged)
            figures("metadata damage: unreadable files verify named")
        if cli:
            run_cli(root, rel, how)
        try:
            casmon.open(root).gc(grace=0)
        except casmon.CasmonError as e:
            assert rel in str(e), (rel, how, str(e))  # gc refuses, naming the file, and deletes nothing
        assert found(root) == N, (rel, how)
        done = repair(casmon.open(root))
        assert done["ok"], (rel, how, done)
        for _ in range(2):
            casmon.open(root).gc(grace=0)
        assert found(root) == N, (rel, how)
        assert casmon.cache(store=casmon.open(root, read_only=True))(square).lookup(N) == [N] * 30
        assert casmon.open(root).verify().ok, (rel, how)
    figures("metadata damage: cases")


@pytest.mark.parametrize("kind", sorted(FILES))
def test_damaged_metadata_loses_no_entry_and_breaks_no_verb(pristine, tmp_path, kind, figures):
    for how in HOWS:
        one_case(pristine, tmp_path, kind, how, 0, figures, cli=how in ("flip", "deep"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(FILES))
def test_every_bit_class_at_many_places_of_each_metadata_file(pristine, tmp_path, kind, figures):
    for seed in range(40):
        one_case(pristine, tmp_path, kind, "flip", seed, figures, cli=seed % 4 == 0)
    for how in HOWS[1:]:
        one_case(pristine, tmp_path, kind, how, 1, figures)
