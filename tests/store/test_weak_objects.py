"""The store's weak set (a ``weakref.WeakSet`` without loading ``_weakrefset`` on a hit): an object collected
leaves it, iterating while objects die is safe, and an object is held by identity."""

from __future__ import annotations

import gc

from casmon.store.lifecycle import WeakObjects


class Thing:
    def __eq__(self, other: object) -> bool:  # equal to every other Thing: the set must still hold each
        return isinstance(other, Thing)

    __hash__ = None  # type: ignore[assignment]


def test_an_object_collected_leaves_the_weak_set():
    s: WeakObjects[Thing] = WeakObjects()
    a, b = Thing(), Thing()
    s.add(a)
    s.add(b)
    s.add(a)
    assert len(s) == 2 and bool(s)
    del a
    gc.collect()
    assert list(s) == [b] and len(s._refs) == 1
    s.discard(b)
    assert not s and list(s) == []


def test_iterating_the_weak_set_while_its_objects_die_is_safe():
    s: WeakObjects[Thing] = WeakObjects()
    things = [Thing() for _ in range(50)]
    for t in things:
        s.add(t)
    seen = 0
    for t in s:
        seen += 1
        things.clear()  # every other object dies mid-iteration
        del t
        gc.collect()
    assert seen >= 1 and list(s) == [] and s._refs == {}


def test_discarding_an_object_not_held_changes_nothing():
    s: WeakObjects[Thing] = WeakObjects()
    a, b = Thing(), Thing()
    s.add(a)
    s.discard(b)
    assert list(s) == [a]
