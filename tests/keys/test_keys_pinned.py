"""Code versions and call keys stay what they were: a change to the code-version walk that moves a key
makes every cache entry of it miss once after an upgrade. The digests below were computed before the
walk learnt to stop at cycles (a class whose values refer back to it had no stable version then: it
depended on where a RecursionError struck, so none is pinned); a change that moves one must be deliberate.

The syntax tree's text differs between Python versions, so each version has its own digests."""

import sys
import textwrap

import pytest

import casmon
from casmon.keys import codeversion as cv

MODULE = "casmon_keypin_mod"

SOURCE = textwrap.dedent('''
    import dataclasses

    THRESH = 2
    PARAMS = {"lr": 0.1, "layers": [1, 2]}


    def helper(x, scale=3):
        return x * scale + THRESH


    class Plain:
        K = 5

        def __init__(self, x):
            self.x = x

        def value(self):
            return self.x * Plain.K + helper(1)


    @dataclasses.dataclass(frozen=True)
    class Cfg:
        lr: float
        epochs: int = 3

        def total(self):
            return self.lr * self.epochs


    class Point:
        def __init__(self, x):
            self.x = x


    Point.ORIGIN = Point(0)


    def f_plain(p):
        return p.value() + PARAMS["lr"]


    def f_cfg(cfg, *, k=2):
        return cfg.total() * k + helper(2)


    def make(n):
        def inner(y):
            return y + n + THRESH
        return inner


    closure = make(4)


    def f_point(p):
        return p.x - Point.ORIGIN.x
''')

PINNED = {
    '3.11': {
        'version f_plain': '4316bc3eee2fb010bc65bb74470324ef',
        'version f_cfg': '63ac3f47fca6e46dab5819af44c3dadb',
        'version closure': '2f44acaa71654d84630dc37e43c8a20f',
        'version f_point': 'd32a6c026ef04ba94d8ff2789646343e',
        'version Plain': '2284f2f15634bde32741f15806a9c51d',
        'version Cfg': '92445cae3ce68f37c67d2cfcba7ebb5b',
        'value Cfg(0.1, 3)': '45ca4ed4fbc2da0a59955d553a5c11ca',
        'value Plain(2)': 'ee85add2689ce615b1fe13a8b78bce32',
        'key f_cfg(Cfg(0.5), k=3)': '62d4bdb95bd3f928d4ca03512f90098b',
    },
    '3.12': {
        'version f_plain': '96abf29c917f6e38393ef866152cce59',
        'version f_cfg': 'de0a8c3174b02cfd9f1ad36975e46214',
        'version closure': '7510d2f9eca8d783b8556a29240a7c9d',
        'version f_point': '0c87338abc476a15b8b68ad69dcca0ac',
        'version Plain': '98876e8ed90d0ec07f882599253fdc59',
        'version Cfg': '84b71bb43df1fcbbd59d9588905907de',
        'value Cfg(0.1, 3)': '7c2cfaecd88c0ab29ee3007c219fb3b0',
        'value Plain(2)': 'ff37c59b4513db13e96207ead2d09c56',
        'key f_cfg(Cfg(0.5), k=3)': '3253e8e3fe4e864eb8f617419e38a63c',
    },
    '3.13': {
        'version f_plain': '86bc6f69cba626ef74f72ec1736682cd',
        'version f_cfg': '61e65064467f5ac44256cb27ad2198d1',
        'version closure': '464bc5a8b1196ff417a6620eba4a7bc8',
        'version f_point': '3283d72998d07c48ae1700992f6a0885',
        'version Plain': '3479e2be2729ed663a81c44e419e1beb',
        'version Cfg': '56e47592e8e8b99cde4f11ac7bdf3a1b',
        'value Cfg(0.1, 3)': '94675dfad6dfa87700d722dcf6d49dd2',
        'value Plain(2)': '6e14424459f85c0eea2c5f358ff21671',
        'key f_cfg(Cfg(0.5), k=3)': 'e23ae090fbdabd6ab851194b5876a68c',
    },
}


def _digests(mod, store):
    out = {}
    for name in ("f_plain", "f_cfg", "closure", "f_point", "Plain", "Cfg"):
        out[f"version {name}"] = cv.function_version(getattr(mod, name)).hex()
    out["value Cfg(0.1, 3)"] = cv.versioned_fingerprint(mod.Cfg(0.1, 3)).hex()
    out["value Plain(2)"] = cv.versioned_fingerprint(mod.Plain(2)).hex()
    f = casmon.cache(mod.f_cfg, store=store)
    out["key f_cfg(Cfg(0.5), k=3)"] = f.__casmon_cache__.key((mod.Cfg(0.5),), {"k": 3}).hex()
    return out


@pytest.fixture
def keypin_mod(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    import importlib

    mod = importlib.import_module(MODULE)
    yield mod
    sys.modules.pop(MODULE, None)


def test_code_versions_and_call_keys_are_those_of_before(keypin_mod, tmp_path):
    want = PINNED.get(f"{sys.version_info[0]}.{sys.version_info[1]}")
    if want is None:
        pytest.skip(f"no digests pinned for Python {sys.version_info[0]}.{sys.version_info[1]}")
    assert _digests(keypin_mod, str(tmp_path / "store")) == want
