import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import casmon

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def min_grace():
    """Shorten gc's shortest grace period in this process (and its children): ``min_grace(0.5)``."""
    from casmon.store import condemned

    old_env = os.environ.get("CASMON_MIN_GRACE")
    old = condemned.MIN_GRACE

    def set_(seconds: float) -> None:
        condemned.configure(seconds)
        os.environ["CASMON_MIN_GRACE"] = str(seconds)

    yield set_
    condemned.configure(old)
    if old_env is None:
        os.environ.pop("CASMON_MIN_GRACE", None)
    else:
        os.environ["CASMON_MIN_GRACE"] = old_env


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run long soak and fuzz variants")


FIGURES: dict[str, int] = {}


@pytest.fixture
def figures():
    """Counters reported at the end of the run (the figures of docs/RELIABILITY.md)."""

    def add(name: str, n: int = 1) -> None:
        FIGURES[name] = FIGURES.get(name, 0) + n

    return add


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)  # an xdist worker: its figures go to the controller
    if workeroutput is not None:
        workeroutput["casmon_figures"] = dict(FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: add up each worker's figures."""
    for name, n in getattr(node, "workeroutput", {}).get("casmon_figures", {}).items():
        FIGURES[name] = FIGURES.get(name, 0) + n


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if FIGURES:
        terminalreporter.write_sep("-", "reliability figures")
        for name, n in sorted(FIGURES.items()):
            terminalreporter.write_line(f"{name}: {n:,}")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="long variant: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


@pytest.fixture(scope="session")
def moto_server():
    """A real S3 API (moto's server) on 127.0.0.1, for the whole test session."""
    pytest.importorskip("moto")
    pytest.importorskip("obstore")
    import time
    import urllib.request

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            break
        except Exception:  # noqa: BLE001 - not up yet
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto server did not start")
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def s3_env(moto_server, monkeypatch):
    """Environment for an S3 store on the moto server, and a fresh bucket; returns (env, bucket)."""
    import boto3

    env = dict(S3_ENV, AWS_ENDPOINT_URL=moto_server)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    bucket = "casmon-" + uuid.uuid4().hex[:12]
    boto3.client("s3", endpoint_url=moto_server, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    return env, bucket


@pytest.fixture
def s3_proxy(moto_server, s3_env, monkeypatch):
    """A FaultProxy in front of the moto server, with AWS_ENDPOINT_URL pointing at it; returns (proxy, bucket)."""
    from tests.support.s3proxy import FaultProxy

    _env, bucket = s3_env  # the bucket is created directly on moto
    proxy = FaultProxy(moto_server).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        yield proxy, bucket
    finally:
        proxy.stop()


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(size)``: a folder on a tmpfs of ``size`` (e.g. "8m"), to fill; skipped where tmpfs cannot be mounted."""
    mounted: list[Path] = []

    def make(size: str = "8m") -> Path:
        d = tmp_path / f"disk{len(mounted)}"
        d.mkdir()
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {p.stderr.decode().strip()[:200]}")
        mounted.append(d)
        return d

    yield make
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def fill_disk(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte; returns the filler file (delete it to make room)."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (64 << 10))
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass
    return filler


@pytest.fixture
def local_store(tmp_path):
    s = casmon.open(tmp_path / "store", autoflush=None)
    yield s
    s.close()


@pytest.fixture(params=["local", "memory", "zip", "s3"])
def any_store(request, tmp_path):
    """The same tests on every backend: a folder, memory, a zip file, S3 (moto's server)."""
    if request.param == "local":
        loc = tmp_path / "store"
    elif request.param == "memory":
        loc = f"memory://{uuid.uuid4().hex}"
    elif request.param == "s3":
        _env, bucket = request.getfixturevalue("s3_env")
        loc = f"s3://{bucket}/store"
    else:
        loc = tmp_path / "store.zip"
    s = casmon.open(loc, autoflush=None)
    s.kind = request.param
    yield s
    s.close()


def run_parallel(commands: list[list[str]], env: dict | None = None, cwd=None, timeout: float = 300) -> list[str]:
    """Run Python processes at once; fail with each failed one's exit status and stderr. Returns their stdout."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    if env:
        e.update(env)
    procs = [subprocess.Popen([sys.executable, "-X", "faulthandler", *c], env=e, cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in commands]
    results = [p.communicate(timeout=timeout) for p in procs]
    failed = [(p.returncode, err[-3000:]) for p, (_o, err) in zip(procs, results) if p.returncode != 0]
    assert not failed, f"processes failed (exit status, stderr): {failed}"
    return [o for o, _ in results]


def run_python(code: str, *args: str, env: dict | None = None, cwd=None, check=True) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter with casmon importable."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    if env:
        e.update(env)
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=e, cwd=cwd, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"subprocess failed ({p.returncode}):\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


#: The last commit before table format 2 and the large-value changes: what "the old code" means in tests.
OLD_COMMIT = "8bd129c"


@pytest.fixture(scope="session")
def old_casmon(tmp_path_factory):
    """casmon as of OLD_COMMIT, extracted from this repository's history (skipped without git or that commit)."""
    root = Path(__file__).resolve().parent.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("needs git and this repository's history")
    dest = tmp_path_factory.mktemp("oldcasmon")
    arch = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", OLD_COMMIT, "casmon"],
                          capture_output=True, timeout=120)
    if arch.returncode != 0:
        pytest.skip(f"commit {OLD_COMMIT} is not in this clone: {arch.stderr.decode()[:200]}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch.stdout, check=True, timeout=120)
    return dest
