"""A lineage answer as a graph a person, a program or a UI can read: nodes with ``kind``/``id``/``label``/``link``,
edges with ``kind``; as text, JSON (:meth:`Graph.to_json`) or Graphviz dot (:meth:`Graph.to_dot`)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

__all__ = ["Graph", "Node", "Edge", "entry_id", "run_id", "file_id", "plain"]


@dataclass
class Node:
    """``kind``: ``entry`` (a cached call), ``file``, ``run``, ``param`` (a run's parameter), ``patch`` (a run's
    uncommitted changes), ``artifact`` (what a run saved) or ``call`` (a logged call of an intercepted function);
    ``status`` of an entry: live, cleared, expired or missing (gone from the store: never an error)."""

    id: str
    kind: str
    label: str
    link: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "label": self.label, "link": self.link, **self.data}


@dataclass
class Edge:
    """``source`` fed ``target``; ``kind``: ``result`` (an entry's result was an argument), ``file`` (a
    ``files=`` parameter), ``used`` (a run read or wrote the entry), ``param``, ``tracked`` (a run's tracked file),
    ``patch``, ``saved`` (a run's artifact), ``argument`` (a logged call took the entry's result)."""

    source: str
    target: str
    kind: str
    label: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"from": self.source, "to": self.target, "kind": self.kind, "label": self.label}


def entry_id(key: str) -> str:
    return "entry:" + key


def run_id(ref: str) -> str:
    return "run:" + ref


def file_id(path: str, digest: str) -> str:
    return f"file:{path}@{digest}"


def entry_link(fn: str, key: str) -> str:
    return f"/cache?fn={_fn_quoted(fn)}&entry={quote(key, safe='')}"


@functools.lru_cache(maxsize=4096)
def _fn_quoted(fn: str) -> str:
    return urlencode({"fn": fn})[3:]  # one function's link is built once, not once per entry


def run_link(ref: str) -> str:
    return "/run/" + quote(ref.split("/", 1)[-1], safe="")


class Graph:
    """Nodes by id, in the order found, and edges (each once).

    A query over a big store may answer with its nodes not made yet (``pending``: a function that adds them):
    ``len(g)`` and :meth:`text` with a ``limit`` read only what they show; :attr:`nodes`, :attr:`edges` and
    the JSON and dot forms make every node."""

    def __init__(self, root: str = "", what: str = "lineage") -> None:
        self.root = root
        self.what = what
        self._nodes: dict[str, Node] = {}
        self._edges: list[Edge] = []
        self._edge_set: set[tuple[str, str, str, str]] = set()
        self.pending: Callable[[Graph], None] | None = None
        #: ``len`` of a pending graph, and its first nodes with their edges: ``(count, head(k) -> Graph)``
        self.sizes: tuple[int, Callable[[int], Graph]] | None = None

    def _made(self) -> None:
        if self.pending is not None:
            make, self.pending = self.pending, None
            self.sizes = None
            make(self)

    @property
    def nodes(self) -> dict[str, Node]:
        self._made()
        return self._nodes

    @property
    def edges(self) -> list[Edge]:
        self._made()
        return self._edges

    def __len__(self) -> int:
        """How many nodes (without making them, where the answer is pending)."""
        return self.sizes[0] if self.pending is not None and self.sizes is not None else len(self.nodes)

    def __bool__(self) -> bool:
        return True

    def add(self, node: Node) -> Node:
        return self._nodes.setdefault(node.id, node)

    def link(self, source: str, target: str, kind: str, label: str = "") -> None:
        k = (source, target, kind, label)
        if k not in self._edge_set:
            self._edge_set.add(k)
            self._edges.append(Edge(source, target, kind, label))

    def of_kind(self, kind: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "root": self.root, "nodes": [n.to_dict() for n in self.nodes.values()],
                "edges": [e.to_dict() for e in self.edges]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=str, allow_nan=False)

    def to_dot(self) -> str:
        shapes = {"entry": "box", "file": "note", "run": "ellipse", "param": "plaintext", "call": "cds", "patch": "note",
                  "artifact": "folder"}
        lines = ["digraph lineage {", "  rankdir=LR;"]
        for n in self.nodes.values():
            style = ', style=dashed' if n.kind == "entry" and n.data.get("status") != "live" else ""
            why = n.data.get("reason")  # stale's why, under the name: the drawing says what the text says
            label = n.label + (f"\n{why}" if isinstance(why, str) and why else "")
            lines.append(f"  {_q(n.id)} [label={_q(label)}, shape={shapes.get(n.kind, 'box')}{style}];")
        for e in self.edges:
            lab = f" [label={_q(e.label)}]" if e.label else ""
            lines.append(f"  {_q(e.source)} -> {_q(e.target)}{lab};")
        lines.append("}")
        return "\n".join(lines)

    def text(self, limit: int | None = None) -> str:
        """Each node on a line, upstream first, with what it fed; past ``limit`` nodes, how many more."""
        total = len(self)
        if limit is not None and total > limit:
            head = self.sizes[1](limit) if self.pending is not None and self.sizes is not None else self._head(limit)
            return (head.text() + f"\n  ... and {total - limit:,} more nodes ({total:,} in all; --all or --json "
                    "lists every one)")
        if not self.nodes:
            return plain(f"{self._title()}: {'nothing is stale' if self.what == 'stale' else 'nothing recorded'}")
        feeds: dict[str, list[Edge]] = {}
        for e in self.edges:
            feeds.setdefault(e.source, []).append(e)
        lines = [plain(f"{self._title()}:")]
        for n in self.nodes.values():
            st, v = n.data.get("status"), n.data.get("version")
            tail = f"  [{st}]" if n.kind == "entry" and st != "live" else ""
            if n.kind == "entry" and isinstance(v, str) and v:  # as `casmon cache NAME` and FN@VERSION name it
                tail = f" (code {v[:12]})" + tail
            to = ", ".join(f"{self.nodes[e.target].label if e.target in self.nodes else e.target}"
                           f"{'.' + e.label if e.label else ''}" for e in feeds.get(n.id, []))
            why = f": {n.data['reason']}" if n.data.get("reason") else ""
            lines.append(plain(f"  {n.kind} {n.label}{tail}{why}" + (f"  -> {to}" if to else "")))
        return "\n".join(lines)

    def _title(self) -> str:
        """The text's first words: "lineage of 3", "what used clean", "stale in ./.casmon"."""
        return {"used by": f"what used {self.root}", "stale": f"stale in {self.root}"}.get(
            self.what, f"{self.what} of {self.root}")

    def _head(self, k: int) -> Graph:
        g = Graph(self.root, self.what)
        for n in list(self.nodes.values())[:k]:
            g.add(n)
        for e in self.edges:
            if e.source in g._nodes:
                g.link(e.source, e.target, e.kind, e.label)
        return g

    def __str__(self) -> str:
        return self.text()

    __repr__ = __str__


#: Characters a crafted function, parameter or path name may hold that would break a line of text or of dot
#: (a NUL ends Graphviz's parse): written as escapes.
_CONTROL = re.compile("[\x00-\x1f\x7f\u2028\u2029]")


def _escape(c: re.Match[str], backslash: str = "\\") -> str:
    o = ord(c.group())
    return f"{backslash}x{o:02x}" if o < 256 else f"{backslash}u{o:04x}"


def plain(s: str) -> str:
    """``s`` with its control characters as escapes: one line of text, whatever a record holds."""
    return _CONTROL.sub(_escape, s)


def _q(s: str) -> str:
    s = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + _CONTROL.sub(lambda c: _escape(c, "\\\\"), s) + '"'
