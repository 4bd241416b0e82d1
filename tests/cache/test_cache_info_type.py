"""``CacheInfo`` is made at its first use (a namedtuple's class costs a first hit ~80 µs) and ``ResultRef`` is
loaded at its first use: a hit makes neither, and every route to one -- ``f.cache_info()``, ``f.ref()``,
``casmon.CacheInfo``, an import, a pickle's lookup, threads racing to it first -- gets the one class, named
``casmon.cache.*`` as always.

Behavioural: checked in fresh interpreters."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.support.processes import ENV

SCRIPT = textwrap.dedent("""
    import json, pickle, sys, threading
    import casmon

    @casmon.cache(store=sys.argv[1])
    def f(x):
        return x + 1

    f(1)
    f(1)
    memoize = sys.modules["casmon.caching.memoize"]
    out = {"made_by_calls": "CacheInfo" in vars(memoize)}
    seen, go = [], threading.Event()

    def grab():
        go.wait()
        seen.append(__import__("casmon.caching", fromlist=["CacheInfo"]).CacheInfo)

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    info = f.cache_info()
    from casmon.caching.memoize import CacheInfo
    by_pickle = pickle.loads(pickle.dumps(info))
    out["one_class"] = len({id(c) for c in seen + [type(info), CacheInfo, casmon.CacheInfo, type(by_pickle),
                                                     sys.modules["casmon.cache"].CacheInfo]}) == 1
    out["name"] = f"{CacheInfo.__module__}.{CacheInfo.__qualname__}"
    out["info"] = list(info)
    out["fields"] = list(info._asdict())
    print(json.dumps(out))
""")


def test_cache_info_is_made_on_first_use_and_is_one_class_by_every_route(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "store")], capture_output=True, text=True,
                       env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["made_by_calls"] is False
    assert got["one_class"] is True
    assert got["name"] == "casmon.cache.CacheInfo"
    assert got["info"][:3] == [1, 1, 1] and got["fields"] == ["hits", "misses", "entries", "stored_bytes"]


def test_result_ref_is_loaded_on_first_use_and_is_one_class_by_every_route(tmp_path):
    script = tmp_path / "r.py"
    script.write_text(textwrap.dedent("""
        import json, pickle, sys
        import casmon

        @casmon.cache(store=sys.argv[1])
        def f(x):
            return x + 1

        f(1)
        f(1)
        out = {"loaded_by_calls": "casmon.caching.resultref" in sys.modules}
        r = f.ref(1)
        from casmon.caching.entries import ResultRef
        from casmon.caching import ResultRef as R2
        out["one_class"] = len({id(c) for c in (type(r), ResultRef, R2, casmon.ResultRef,
                                                sys.modules["casmon.cache"].ResultRef)}) == 1
        out["name"] = f"{ResultRef.__module__}.{ResultRef.__qualname__}"
        out["value"] = r.load()
        print(json.dumps(out))
    """))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "store")], capture_output=True, text=True,
                       env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"loaded_by_calls": False, "one_class": True, "name": "casmon.cache.ResultRef", "value": 2}
