"""A cached function's calls bind, and key, the same whether its parameters are read from its code (the binder's
fast path, which a first hit takes without loading inspect) or by ``inspect.signature``: over many signatures
(positional-only, defaults, ``*args``, keyword-only, ``**kwargs``) and calls, each bound value, each refusal and
each key agree; and partials, ``functools.wraps`` wrappers, methods, classmethods and staticmethods too."""

from __future__ import annotations

import functools
import inspect
import types

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import casmon
from casmon.caching import binder as binder_mod
from casmon.caching.binder import Binder

VALUES = st.one_of(st.integers(-3, 3), st.sampled_from(["x", "", None, 1.5, (1, 2)]))


@st.composite
def signatures(draw):
    """``(source of def f(...), namespace with its defaults, parameter names)``."""
    n_posonly, n_pos, n_kwonly = draw(st.integers(0, 3)), draw(st.integers(0, 3)), draw(st.integers(0, 3))
    varargs, varkw = draw(st.booleans()), draw(st.booleans())
    npos = n_posonly + n_pos
    n_defaults = draw(st.integers(0, npos))
    ns: dict = {}
    parts: list[str] = []
    names: list[str] = []

    def default(name: str) -> str:
        ns["D_" + name] = draw(VALUES)
        return f"{name}=D_{name}"

    for i in range(npos):
        name = f"p{i}"
        names.append(name)
        parts.append(default(name) if i >= npos - n_defaults else name)
        if n_posonly and i == n_posonly - 1:
            parts.append("/")
    if varargs:
        parts.append("*args")
        names.append("args")
    elif n_kwonly:
        parts.append("*")
    for i in range(n_kwonly):
        name = f"k{i}"
        names.append(name)
        parts.append(default(name) if draw(st.booleans()) else name)
    if varkw:
        parts.append("**kw")
        names.append("kw")
    return f"def f({', '.join(parts)}):\n    return 0\n", ns, names


@st.composite
def calls(draw, names):
    args = tuple(draw(st.lists(VALUES, max_size=7)))
    pool = names + ["zz", "other", "aa"]
    keys = draw(st.lists(st.sampled_from(pool), unique=True, max_size=6))
    return args, {k: draw(VALUES) for k in keys}


def _inspect_bind(fn, args, kwargs):
    """What the keys bound before the binder: inspect's binding, defaults applied, ``**kwargs`` in key order."""
    sig = inspect.signature(fn)
    ba = sig.bind(*args, **kwargs)
    ba.apply_defaults()
    if any(p.name not in ba.arguments for p in sig.parameters.values()):
        raise TypeError("unbound")  # 3.13 binds a positional-only name given by keyword into **kwargs, unbound
    return [dict(sorted(ba.arguments[p.name].items())) if p.kind == p.VAR_KEYWORD else ba.arguments[p.name]
            for p in sig.parameters.values()]


def _outcome(bind, fn, args, kwargs):
    """``("ok", values, their fingerprint)``, the fingerprint telling dicts' key orders apart; or a refusal."""
    try:
        vals = bind(fn, args, kwargs)
    except TypeError:
        return ("TypeError", None, None)
    return ("ok", vals, casmon.fingerprint(vals))


def _by_inspect(monkeypatch):
    """Binders made inside the block read their parameters with inspect, as before the binder."""
    monkeypatch.setattr(binder_mod, "_code_params", lambda fn: None)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), sig=signatures())
def test_the_code_read_binder_binds_every_call_as_inspect_does(data, sig):
    src, ns, names = sig
    exec(src, ns)
    f = ns["f"]
    b = Binder(f)
    assert b._sig is None, "a plain function's parameters were read by inspect"
    sig_ = inspect.signature(f)
    assert [tuple(p) for p in b.params] == \
        [(p.name, int(p.kind), p.default if p.default is not p.empty else binder_mod.EMPTY) for p in sig_.parameters.values()]
    for _ in range(5):
        args, kwargs = data.draw(calls(names))
        got = _outcome(lambda fn, a, k: b.bind(a, dict(k)), f, args, kwargs)
        want = _outcome(_inspect_bind, f, args, dict(kwargs))
        assert got == want, (src, args, kwargs)
        if got[0] == "ok":
            fast = b._fast(args, dict(kwargs))
            assert fast is None or fast == want[1], (src, args, kwargs)
    # the same function bound as a method: its first parameter takes the object, as inspect has it
    m = types.MethodType(f, object())
    try:
        want_params = [(p.name, int(p.kind)) for p in inspect.signature(m).parameters.values()]
    except ValueError:  # no parameter to take the object: inspect refuses, and so does the binder
        with pytest.raises(ValueError):
            Binder(m)
        return
    bm = Binder(m)
    assert [(p.name, p.kind) for p in bm.params] == want_params
    for _ in range(3):
        args, kwargs = data.draw(calls(names))
        got = _outcome(lambda fn, a, k: bm.bind(a, dict(k)), m, args, kwargs)
        assert got == _outcome(_inspect_bind, m, args, dict(kwargs)), (src, "method", args, kwargs)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = casmon.open(tmp_path_factory.mktemp("binder") / "store")
    yield s
    s.close()


def _keys(fn, store, monkeypatch, calls_):
    """Each call's key by the code-read binder, and by inspect's binding (a second cached function of ``fn``)."""
    fast = casmon.cache(fn, store=store, version="1")
    with monkeypatch.context() as m:
        _by_inspect(m)
        slow = casmon.cache(fn, store=store, version="1")
    out = []
    for args, kwargs in calls_:
        pair = []
        for c in (fast, slow):
            try:
                pair.append(c.__casmon_cache__.key(args, dict(kwargs)))
            except TypeError as e:
                pair.append(("TypeError", str(e).split(":", 1)[-1]))
        out.append(pair)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), sig=signatures())
def test_a_call_keys_the_same_by_the_code_read_binder_and_by_inspect(store, monkeypatch, data, sig):
    src, ns, names = sig
    exec(src, ns)
    f = ns["f"]
    cs = [data.draw(calls(names)) for _ in range(4)]
    for fast, slow in _keys(f, store, monkeypatch, cs):
        assert fast == slow, src


def _plain(a, b=2, *rest, c, d=4, **kw):
    return a


class _Thing:
    def method(self, a, b=2, *rest, c=3, **kw):
        return a

    @classmethod
    def klass(cls, a, /, b=1, **kw):
        return a

    @staticmethod
    def static(a, b=(1, 2)):
        return a


def _wrapped():
    @functools.wraps(_plain)
    def wrapper(*args, **kwargs):
        return _plain(*args, **kwargs)
    return wrapper


CALLS = [((1,), {"c": 3}), ((1, 5, 6, 7), {"c": 3, "z": 1, "y": 2}), ((), {"a": 1, "c": 1}), ((1,), {}),
         ((1, 2), {"b": 3, "c": 1}), ((1,), {"c": 1, "kw": 5, "rest": 6})]


@pytest.mark.parametrize("make", [
    lambda: _plain,
    lambda: functools.partial(_plain, 10, c=1),
    _wrapped,
    lambda: _Thing().method,
    lambda: _Thing.klass.__func__.__get__(_Thing),  # a classmethod's bound form
    lambda: _Thing.static,
], ids=["function", "partial", "wraps", "method", "classmethod", "staticmethod"])
def test_wrappers_methods_and_partials_key_as_inspect_binds_them(store, monkeypatch, make):
    for fast, slow in _keys(make(), store, monkeypatch, CALLS):
        assert fast == slow


def test_decorated_classmethods_and_methods_bind_their_calls_as_before(store, monkeypatch):
    """``@casmon.cache`` on a method and on a classmethod, called through the class and an instance."""
    def build():
        class K:
            @casmon.cache(store=store, version="1")
            def m(self, a, *rest, b=1, **kw):
                return a

            @casmon.cache(store=store, version="1")
            @classmethod
            def c(cls, a, b=2):
                return a
        return K

    fast = build()
    with monkeypatch.context() as m:
        _by_inspect(m)
        slow = build()
    for K in (fast, slow):
        assert K().m(1, 2, b=3, z=4) == 1 and K.c(5) == 5
    state_f, state_s = fast.__dict__["m"].__casmon_cache__, slow.__dict__["m"].__casmon_cache__
    assert state_f._binder._sig is None and state_s._binder._sig is not None
    obj = object()
    for args, kwargs in [((obj, 1), {}), ((obj, 1, 2, 3), {"b": 2, "q": 1}), ((obj,), {"a": 1})]:
        assert state_f.bind(args, kwargs) == state_s.bind(args, kwargs)


def test_a_bad_call_raises_the_same_type_error_naming_the_function(store):
    f = casmon.cache(_plain, store=store, version="1")
    for args, kwargs in [((), {}), ((1,), {"c": 1, "a": 2}), ((), {"c": 1}), ((1,), {})]:
        with pytest.raises(TypeError, match="_plain"):
            f(*args, **kwargs)


def test_reassigned_defaults_are_read_from_the_code_again(store):
    def g(a, b=1):
        return a + b

    cg = casmon.cache(g, store=store, version="1")
    assert cg(1) == 2
    g.__defaults__ = (5,)
    assert cg(1) == 6
    assert cg.__casmon_cache__._binder._sig is None


def test_a_function_whose_defaults_outnumber_its_parameters_is_read_by_inspect():
    def h(a):
        return a

    h.__defaults__ = (1, 2)  # Python binds the last one; inspect reads these its own way
    b = Binder(h)
    assert b._sig is not None


def test_unwrapping_without_inspect_ends_where_inspect_unwrap_ends():
    """Names (part of every key) and defaults come from the end of the ``__wrapped__`` chain, read as
    ``inspect.unwrap`` reads it, also for an attribute that is None or a chain that loops."""
    from casmon.keys.codeversion import _unwrap, function_name

    class NoneWrapped:
        __wrapped__ = None

        def __call__(self):
            return 1

    def inner():
        return 1

    @functools.wraps(inner)
    def outer():
        return inner()

    looped = functools.partial(inner)
    looped.__dict__["__wrapped__"] = looped  # a cycle: inspect raises, both keep the object
    for obj in (NoneWrapped(), outer, inner, _plain, looped):
        try:
            want = inspect.unwrap(obj)
        except ValueError:
            want = obj
        assert binder_mod.unwrap(obj) is want and _unwrap(obj) is want
    assert function_name(NoneWrapped()) == "builtins.NoneType.__call__"  # as it always was


def test_a_positional_only_parameter_given_by_keyword_is_a_type_error_as_the_function_says(store):
    """``f(a=1)`` of ``def f(a, /, **kw)``: Python raises TypeError (``a`` is missing). Python 3.13's inspect
    binds the keyword into ``kw`` and leaves ``a`` unbound, which made the cached call raise KeyError."""
    def f(a, /, **kw):
        return a

    with pytest.raises(TypeError):
        f(a=1)
    cf = casmon.cache(f, store=store, version="1")
    with pytest.raises(TypeError, match="missing a required argument: 'a'|positional only"):
        cf(a=1)
    assert cf(1, a=2) == 1  # given by position, the keyword goes into kw


def test_a_swapped_code_object_keys_each_argument_of_the_new_code(store):
    """``f.__code__ = g.__code__`` after decoration: the call binds to the new code's parameters, never keying
    ``f(1, 2)`` and ``f(1, 3)`` alike by the old code's one parameter (a wrong hit)."""
    for pin in (None, "1"):
        def f(a):
            return (a,)

        def g(a, b=0):
            return (a, b, "g")

        cf = casmon.cache(f, store=store, version=pin)
        assert cf(1) == (1,)
        f.__code__ = g.__code__
        assert cf(1, 2) == (1, 2, "g")
        assert cf(1, 3) == (1, 3, "g")
        assert cf(1, b=4) == (1, 4, "g")


def test_the_inspect_fallback_binds_the_parameters_the_binder_read(monkeypatch):
    """A call the fast path refuses is bound by inspect against the same parameters the binder read, even where
    the function was changed since: no value is left out of the key."""
    def f(a):
        return a

    def g(a, b):
        return a

    b = Binder(f)
    f.__code__ = g.__code__
    with pytest.raises(TypeError, match="too many positional arguments"):
        b.bind((1, 2), {})


def _function_reading(attr, value):
    def f(a, b=1):
        return a

    setattr(f, attr, value)
    return f


@pytest.mark.parametrize("make", [
    lambda: _function_reading("__text_signature__", "(z, /)"),
    lambda: _PM.pm,  # 3.13 marks it __partialmethod__, 3.12 _partialmethod
    lambda: _PM.apm,
], ids=["text_signature", "partialmethod", "async-partialmethod"])
def test_every_attribute_inspect_reads_a_function_by_sends_it_to_inspect(make):
    fn = make()
    b = Binder(fn)
    want = [(p.name, int(p.kind), binder_mod.EMPTY if p.default is p.empty else p.default)
            for p in inspect.signature(fn).parameters.values()]
    assert [tuple(p) for p in b.params] == want
    assert binder_mod.is_async(fn) == inspect.iscoroutinefunction(fn)
    assert binder_mod.is_generator(fn) == (inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn))


class _PM:
    def m(self, a, b=2):
        return a

    async def am(self, a, b=2):
        return a

    pm = functools.partialmethod(m, 1)
    apm = functools.partialmethod(am, 1)


def test_a_parameter_named_self_is_given_by_keyword_to_the_cached_function_and_its_helpers(store):
    """``f(self=1, x=2)`` of ``def f(self, x)`` is a call Python takes: the wrapper's own ``self`` took it."""
    def f(self, x):
        return (self, x)

    cf = casmon.cache(f, store=store, version="1")
    assert cf(self=1, x=2) == (1, 2)
    assert cf.is_cached(self=1, x=2) and cf.lookup(self=1, x=2) == (1, 2) and cf.ref(self=1, x=2).load() == (1, 2)
    assert cf.refresh(self=1, x=2) == (1, 2) and cf.explain(self=1, x=2) is not None
    from casmon.compat.joblib import Memory

    def h(self, x):
        return (self, x)

    g = Memory(store, verbose=0).cache(h)
    assert g(self=1, x=2) == (1, 2) and g.call(self=1, x=2)[0] == (1, 2) and g.check_call_in_cache(self=1, x=2)


def test_keyword_only_defaults_changed_in_place_key_calls_anew_with_a_pinned_version(store):
    """``f.__kwdefaults__["b"] = 2``: the same dict, another default; the call computes with it, so it keys by
    it (with ``version=`` pinned nothing else notices: it was a wrong hit)."""
    def f(a, *, b=1):
        return (a, b)

    cf = casmon.cache(f, store=store, version="1")
    assert cf(1) == (1, 1)
    f.__kwdefaults__["b"] = 2
    assert cf(1) == (1, 2)
    del f.__kwdefaults__["b"]
    with pytest.raises(TypeError, match="b"):
        cf(1)
    assert cf(1, b=1) == (1, 1)


def test_a_partials_function_with_reassigned_defaults_keys_calls_by_them_with_a_pinned_version(store):
    """``partial(f, 1)`` binds by ``f``'s parameters: ``f.__defaults__`` reassigned, the call computes with the new
    default, so it keys by it (with ``version=`` pinned it was a wrong hit)."""
    def f(a, b=1):
        return (a, b)

    cf = casmon.cache(functools.partial(functools.partial(f, 1)), store=store, version="1")
    assert cf() == (1, 1)
    f.__defaults__ = (2,)
    assert cf() == (1, 2)
