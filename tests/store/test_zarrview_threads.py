"""The zarr view read by zarr's event loop while nodes are built in worker threads (casmon/store/zarrview.py's
Tree): a build that needs zarr's loop never waits on a loop that waits on the build, and a node being built is
served once built, never missing."""

import threading

import pytest
import zarr

import casmon
from casmon.store.zarrview import Tree, ZarrView


def _in_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_node_whose_build_asks_zarr_for_another_node_does_not_hang_the_view(tmp_path):
    """Building a value's node makes zarr metadata through zarr's own event loop (an array kind's template): the loop
    serving another node's zarr.json meanwhile must not wait for the tree the build holds."""
    tree = Tree()
    tree.group("b", {"k": 1})
    view = None

    def build(name):
        assert zarr.open_group(view, mode="r", path="b").attrs["k"] == 1  # zarr's loop, from inside a build
        tree.group(f"a/{name}", {"built": True})

    tree.lazy("a", lambda: ["x"], build)
    view = ZarrView(casmon.open(tmp_path / "s"), tree)
    t, out = _in_thread(lambda: dict(zarr.open_group(view, mode="r", path="a/x").attrs))
    t.join(120)
    assert not t.is_alive(), "the view hung: zarr's loop waited on a build waiting on zarr's loop"
    assert out == {"value": {"built": True}}


def test_a_node_asked_for_while_another_thread_builds_it_is_served_once_built(tmp_path):
    tree = Tree()
    started, release = threading.Event(), threading.Event()

    def build(name):
        started.set()
        release.wait(60)
        tree.group(f"a/{name}", {"built": True})

    tree.lazy("a", lambda: ["x"], build)
    view = ZarrView(casmon.open(tmp_path / "s"), tree)
    first, out1 = _in_thread(lambda: dict(zarr.open_group(view, mode="r", path="a/x").attrs))
    assert started.wait(60)
    second, out2 = _in_thread(lambda: dict(zarr.open_group(view, mode="r", path="a/x").attrs))
    second.join(2)  # asked while the build runs: it waits for it (or, wrongly, finds no node at once)
    release.set()
    for t in (first, second):
        t.join(120)
        assert not t.is_alive()
    assert out1 == {"value": {"built": True}}
    assert out2 == {"value": {"built": True}}, out2


@pytest.mark.parametrize("bulk", [False, True])
def test_a_group_is_never_complete_while_a_child_is_being_built(tmp_path, bulk):
    """A consolidated zarr.json is served only for a complete group: one made mid-build would miss nodes."""
    tree = Tree()
    seen = []

    def build(name):
        seen.append(tree.complete("a") or tree.complete(""))
        tree.group(f"a/{name}")

    def build_all(names):
        for n in names:
            build(n)

    tree.lazy("a", lambda: ["x", "y"], build, bulk=build_all if bulk else None)
    (tree.build_all if bulk else tree.expand)("a")
    assert seen and not any(seen)
    assert tree.complete("a") and tree.complete("")
