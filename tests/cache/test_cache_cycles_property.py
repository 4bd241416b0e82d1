"""Any graph of classes, instances and modules: a cached function over it ends, hits, and misses after an edit.

Hypothesis builds modules of classes whose values refer back to them: ``__slots__`` classes,
Enums, frozen slots dataclasses, user metaclasses (holding an instance), registries of a class's
own instances, class attributes holding an instance of the class or of another class (cycles of
two and three classes), nested classes holding their owner. A cached function reads one of them as
its argument, in its body, or both. Each call runs in a thread with a generous deadline, so a walk
that does not end fails the example (shrinking is off: a hang would cost a deadline per step).
"""

import importlib
import sys
import tempfile
import textwrap
import uuid
import weakref
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

import casmon
from tests.support import deadline
from casmon.keys import codeversion as cv

pytestmark = pytest.mark.filterwarnings("ignore::casmon.caching.CacheWarning")  # each edit says what changed

DEADLINE = 60.0
KINDS = ("plain", "slots", "enum", "dataclass", "plain_dataclass")


def within(fn, *args, **kwargs):
    return deadline.within(DEADLINE, fn, *args, **kwargs)


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 3))
    classes = []
    for i in range(n):
        kind = draw(st.sampled_from(KINDS))
        classes.append({
            "kind": kind,
            "meta": kind != "enum" and draw(st.booleans()),
            "meta_holds": draw(st.booleans()),
            "holds_self": draw(st.booleans()),
            "registry": draw(st.booleans()),
            "peer": draw(st.none() | st.integers(0, n - 1)),
            "nested": kind != "enum" and draw(st.booleans()),  # a class in an Enum is a member before 3.13
        })
    return {
        "classes": classes,
        "use": draw(st.sampled_from(("arg", "body", "both"))),
        "edit": draw(st.sampled_from(("method", "metaclass"))),
    }


def instance(i, c, value=1):
    return f"C{i}.A" if c["kind"] == "enum" else f"C{i}({value})"


def module_source(g):
    out = ["import dataclasses", "import enum", ""]
    for i, c in enumerate(g["classes"]):
        meta = ""
        if c["meta"]:
            meta = f", metaclass=Meta{i}" if c["kind"] == "enum" else f"(metaclass=Meta{i})"
            out += [f"class Meta{i}(type):",
                    "    def __call__(cls, *args, **kwargs):",
                    "        return type.__call__(cls, *args, **kwargs)",
                    "",
                    f"def _meta_call_alt{i}(cls, *args, **kwargs):",
                    "    obj = type.__call__(cls, *args, **kwargs)",
                    "    return obj",
                    ""]
        kind = c["kind"]
        if kind == "enum":
            out += [f"class C{i}(enum.Enum):", "    A = 1", "    B = 2"]
        elif kind in ("dataclass", "plain_dataclass"):
            out += ["@dataclasses.dataclass(frozen=True, slots=True)" if kind == "dataclass" else "@dataclasses.dataclass",
                    f"class C{i}{meta}:", "    x: int"]
        else:
            out += [f"class C{i}{meta}:"]
            if kind == "slots":
                out += ['    __slots__ = ("x",)']
            out += ["    def __init__(self, x):", "        self.x = x"]
            if c["registry"]:
                out += ["        type(self).all.append(self)"]
        if c["nested"]:
            out += ["    class Inner:", "        OWNER = None"]
        out += ["    def tag(self):", f"        return {i}", "",
                f"def _tag_alt{i}(self):", f"    return {i + 100}", ""]
    for i, c in enumerate(g["classes"]):
        if c["registry"]:
            out += [f"C{i}.all = []"] + ([f"{instance(i, c, 7)}", f"{instance(i, c, 8)}"] if c["kind"] in ("plain", "slots")
                                        else [f"C{i}.all.extend([{instance(i, c, 7)}, {instance(i, c, 8)}])"])
        if c["holds_self"]:
            out += [f"C{i}.DEFAULT = {instance(i, c, 0)}"]
        if c["nested"]:
            out += [f"C{i}.Inner.OWNER = {instance(i, c, 5)}"]
        if c["meta"] and c["meta_holds"]:
            out += [f"Meta{i}.LAST = {instance(i, c, 6)}"]
    for i, c in enumerate(g["classes"]):
        if c["peer"] is not None:
            j = c["peer"]
            out += [f"C{i}.PEER = {instance(j, g['classes'][j], 4)}"]
    c0 = g["classes"][0]
    out += [f"INST0 = {instance(0, c0, 3)}", ""]
    if g["use"] == "arg":
        out += ["def f(x):", "    return x.tag()"]
    elif g["use"] == "body":
        out += ["def f(x):", "    return x + C0.tag(INST0)"]
    else:
        out += ["def f(x):", "    return x.tag() + len(C0.__name__)"]
    return "\n".join(out) + "\n"


def versions_in_order(mod, g, reverse):
    """Every class's version, each computed afresh, the classes met in this order or the reverse."""
    objs = [getattr(mod, f"C{i}") for i in range(len(g["classes"]))] + [mod.f]
    objs += [getattr(mod, f"Meta{i}") for i, c in enumerate(g["classes"]) if c["meta"]]
    fresh = [cv.VersionTracker(o) for o in objs]
    for o, t in zip(objs, fresh):
        cv._trackers[weakref.ref(o, cv._forget_tracker)] = t  # as version_tracker keeps it
    for t in (fresh[::-1] if reverse else fresh):
        t.current()
    return [t.digest for t in fresh]


@pytest.mark.parametrize("seeded", [True])
def test_a_cached_function_over_any_graph_of_classes_ends_hits_and_misses_after_an_edit(seeded):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        sys.path.insert(0, d)
        store = casmon.open(root / "store", autoflush=None)
        try:
            run_examples(root, store)
        finally:
            store.close()
            sys.path.remove(d)


def run_examples(root, store):
    ran = []

    @settings(max_examples=500, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(graphs())
    def check(g):
        ran.append(g)
        src = module_source(g)
        name = f"cycles_{uuid.uuid4().hex[:16]}"
        (root / f"{name}.py").write_text(src)
        importlib.invalidate_caches()
        mod = importlib.import_module(name)
        try:
            f = casmon.cache(mod.f, store=store)
            arg = mod.INST0 if g["use"] != "body" else 2
            want = mod.f(arg)
            note = f"module:\n{textwrap.indent(src, '    ')}"
            assert within(f, arg) == want, note
            assert within(f, arg) == want, note
            state = f.__casmon_cache__
            assert (state.misses, state.hits) == (1, 1), note
            assert versions_in_order(mod, g, reverse=True) == versions_in_order(mod, g, reverse=False), \
                f"a version depends on which class was met first\n{note}"
            c0 = g["classes"][0]
            if g["edit"] == "metaclass" and c0["meta"]:
                mod.Meta0.__call__.__code__ = mod._meta_call_alt0.__code__
            else:
                mod.C0.tag.__code__ = mod._tag_alt0.__code__
            after = within(f, arg)
            assert after == mod.f(arg), note
            assert state.misses == 2, f"no miss after an edit of the code of C0\n{note}"
        finally:
            sys.modules.pop(name, None)

    check()
    assert len(ran) >= 500
