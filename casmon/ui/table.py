"""The runs table: a row per run, its columns in groups, the filter (which says what is wrong) and the sort.

Columns: the fixed ones (run, comment, status, start, duration, commit, dirty);
*metrics* -- ``metric.NAME``, the last value of each logged series, from
``r.metric_summary()`` (no series is read), right after the fixed columns, so
the numbers a reader looks for first are on screen however many parameters
there are; and *parameters* -- ``param.NAME`` for each of ``r.flat_params()``
and ``info.NAME`` for each scalar of the run's info, nested dicts flattened
(``info.cfg.lr``). Each group's columns are in sorted order, so a table keeps
its layout from one reload to the next.

A filter is words (found in any cell) and comparisons (``loss<0.3 status=ok``), side by side or joined
by ``and``, ``or`` and parentheses (``status:ok and (lr>0.01 or tag:baseline)``: :func:`parse_query`);
``tag:NAME`` finds runs tagged NAME, and a fixed column with a colon (``status:ok``) is an equality.
A comparison names a fixed column (by its name or its header: ``start`` or
``started``), a prefixed column (``metric.loss``, ``param.lr``, ``info.seed``),
or a bare name that exactly one group has; a bare name two groups have (a
parameter ``loss`` and a metric ``loss``) is an error that names both. Values
compare as the column's cells are: numbers as numbers, ``start`` with ISO dates
and times (local time, as shown), yes/no columns (``dirty``) with yes, no, true
or false, ``commit`` by a prefix of the hash (as git takes it). A comparison
with nothing on one side, naming a column no run has, or with a value the
column's cells cannot be compared with (``lr<abc``) is a :class:`FilterError`
naming the term and why, never an empty table.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from casmon.runs import RunInfo, flatten
from casmon.runs import index as runs_index
from casmon.runs.sysmetrics import users_first
from casmon.ui.model import LIVE_STATUSES, Entry, RunIndex, is_number, is_scalar, run_number
from casmon.ui.values import cell_text, short_when, summary_text
from casmon.view.display import hexshort, seconds, show

FIXED_COLUMNS = ["run", "comment", "status", "start", "duration", "commit", "dirty"]
#: Column groups by prefix (a bare filter name is looked for in each); the label each group's header shows.
GROUPS = [("param.", "parameters"), ("info.", "parameters"), ("metric.", "metrics (last value)")]
#: At most this many parameter (and info) columns, and metric columns, on one page of the table.
MAX_PARAM_COLUMNS = 60
MAX_METRIC_COLUMNS = 40
_OPS = ("<=", ">=", "!=", "=", "<", ">")
_TERM_RE = re.compile(r"^([^<>=!]*)(<=|>=|!=|=|<|>)(.*)$")
_NAME_RE = re.compile(r"^[A-Za-z_][\w.\-]*$")
#: Parentheses nested deeper than this are a :class:`FilterError` (the parser and the test it builds recurse).
MAX_NESTING = 50


class FilterError(ValueError):
    """A filter term that cannot be applied; the message names the term and says why."""


class AmbiguousColumn(FilterError):
    """A bare column name that two groups have (a parameter ``lr`` and a metric ``lr``)."""


def is_column(col: str) -> bool:
    """A column a table can have (the server refuses to sort by anything else)."""
    return col in FIXED_COLUMNS or any(col.startswith(p) and len(col) > len(p) for p, _ in GROUPS)


def row_of(r: RunInfo, e: Entry) -> dict[str, Any]:
    """A run's cells by column (see the module docstring)."""
    m = r.manifest
    git = m.get("git")
    g: dict[str, Any] = git if isinstance(git, dict) else {}
    elapsed = r.elapsed
    if elapsed is None and is_number(m.get("start")) and is_number(m.get("end")):
        elapsed = m["end"] - m["start"]
    row: dict[str, Any] = {"run": e.name, "comment": m.get("comment") or "", "status": r.status,
                           "start": m.get("start", e.start), "duration": elapsed, "commit": g.get("commit") or "",
                           "dirty": bool(g.get("dirty") or g.get("patch")) if g else None}
    try:
        params = r.flat_params()
    except Exception:  # noqa: BLE001 - a crafted manifest: the row shows what it can
        params = {}
    for k, v in params.items():
        row[f"param.{k}"] = v if is_scalar(v) else summary_text(v)
    info = m.get("info")
    if isinstance(info, dict):
        for k, v in flatten(info).items():
            if is_scalar(v):
                row[f"info.{k}"] = v
    for k, s in r.metric_summary().items():
        row[f"metric.{k}"] = s.get("last")
    return row


def fixed_text(col: str, v: Any) -> str:
    """A fixed column's cell as the table shows it."""
    if col == "start":
        return short_when(v)
    if col == "duration":
        return seconds(v)
    if col == "commit":
        return hexshort(v, 10) if v else ""
    if col == "dirty":
        return "yes" if v else ""
    if col == "comment":
        return show(v, 80) if v else ""
    return "" if v is None else str(v)


def cell_texts(row: dict[str, Any]) -> dict[str, str]:
    """Every cell of a row as the table shows it, as text (what the table's script sets while a run goes on,
    and what it builds a new run's row from)."""
    return {k: fixed_text(k, v) if k in FIXED_COLUMNS else cell_text(v) for k, v in row.items() if is_column(k)}


def sort_key(v: Any) -> tuple[int, float, str]:
    """Numbers (infinities too), then text, then NaN, then empty cells (mixed types sort without errors; a
    NaN, which compares with nothing, never takes part in a comparison)."""
    if type(v) is bool:
        return (0, float(v), "")
    if type(v) in (int, float):
        return (2, 0.0, "") if v != v else (0, float(v), "")
    if v is None or v == "":
        return (3, 0.0, "")
    return (1, 0.0, str(v).lower())


@dataclass
class Term:
    """One filter term: a word to find, or ``column op value``."""

    text: str  # as typed
    word: str = ""
    column: str = ""
    op: str = ""
    value: str = ""
    negated: bool = False  # ``-tag:NAME``: the runs without the tag


def parse_filter(q: str) -> list[Term]:
    """``loss<0.3 status=ok base``: comparisons and words; a malformed comparison is a :class:`FilterError`."""
    return [_one_term(tok) for tok in _split(q)]


_QUOTES = "\"'"


def _split(q: str) -> list[str]:
    """``q`` cut at whitespace outside quotes; a quote opens where a word, a value (after ``=``, ``:``, ...) or a
    parenthesis begins, so an apostrophe inside a word (``it's``) is text. The tokens keep their quotes."""
    toks: list[str] = []
    i, n = 0, len(q)
    while i < n:
        if q[i].isspace():
            i += 1
            continue
        start = i
        while i < n and not q[i].isspace():
            if q[i] in _QUOTES and (i == start or q[i - 1] in "(<>=!:"):
                end = q.find(q[i], i + 1)
                if end < 0:
                    raise FilterError(f"filter {_quoted(q)}: the {q[i]} opened at character {i + 1} is not closed")
                i = end + 1
            else:
                i += 1
        toks.append(q[start:i])
    return toks


def _unquoted(s: str) -> tuple[str, bool]:
    """``s`` without the quotes around it, and whether it had them."""
    if len(s) >= 2 and s[0] in _QUOTES and s[-1] == s[0]:
        return s[1:-1], True
    return s, False


def _one_term(tok: str) -> Term:
    word, quoted = _unquoted(tok)
    m = None if quoted else _TERM_RE.match(tok)
    if not m:
        return Term(tok, word=word.lower())
    name, op, value = m.groups()
    if not name:
        raise FilterError(f"filter term {tok!r}: a comparison needs a column name before {op!r} "
                          f"(for example loss{op}0.3)")
    if not value:
        raise FilterError(f"filter term {tok!r}: a comparison needs a value after {op!r} (for example {name}{op}0.3)")
    if name.startswith("-"):
        neg = {"=": "!=", "!=": "=", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}[op]
        raise FilterError(f"filter term {tok!r}: a comparison is not negated by a leading {name[0]!r}; "
                          f"write the opposite comparison: {name.lstrip('-')}{neg}{value}")
    if not _NAME_RE.match(name):
        raise FilterError(f"filter term {tok!r}: {name!r} is not a column name (a column name starts with a "
                          f"letter or '_'; then letters, digits, '_', '.' and '-')")
    value, quoted = _unquoted(value)
    if not quoted and any(value.startswith(o) for o in _OPS):
        raise FilterError(f"filter term {tok!r}: one comparison a term (<, <=, >, >=, = or !=)")
    return Term(tok, column=name, op=op, value=value)


@dataclass
class Expr:
    """Terms joined by ``and`` or ``or`` (each item a :class:`Term` or a nested ``Expr``)."""

    op: str
    items: list[Any]


def _tokens(q: str, parens: bool) -> list[str]:
    out: list[str] = []
    for tok in _split(q):
        if not parens:
            out.append(tok)
            continue
        lead = len(tok) - len(tok.lstrip("("))
        body = tok[lead:]
        trail = len(body) - len(body.rstrip(")"))
        out.extend("(" * lead)
        if body[: len(body) - trail]:
            out.append(body[: len(body) - trail])
        out.extend(")" * trail)
    return out


def parse_query(q: str) -> Expr:
    """A filter with ``and``, ``or`` and parentheses: ``status:ok and (lr>0.01 or tag:baseline)``. Terms side
    by side are joined by ``and`` (today's syntax); ``tag:NAME`` finds runs tagged NAME; ``status:ok`` (a
    fixed column, a colon) is ``status=ok``. Parentheses are read where they open or close a term; a filter
    whose parentheses do not pair is read without them (a value such as ``comment=f(x)`` stays whole)."""
    toks = _tokens(q, True)
    if toks.count("(") != toks.count(")"):
        toks = _tokens(q, False)
    at = 0
    depth = 0

    def peek() -> str | None:
        return toks[at] if at < len(toks) else None

    def atom() -> Any:
        nonlocal at, depth
        tok = toks[at]
        at += 1
        if tok == "(":
            depth += 1
            if depth > MAX_NESTING:
                raise FilterError(f"filter {_quoted(q)}: parentheses nested more than {MAX_NESTING} deep")
            inner = alternatives()
            depth -= 1
            if peek() != ")":
                raise FilterError(f"filter {_quoted(q)}: a '(' is not closed")
            at += 1
            return inner
        if tok == ")":
            raise FilterError(f"filter {_quoted(q)}: a ')' closes nothing")
        return _term(tok)

    def conjunction() -> Expr:
        nonlocal at
        items: list[Any] = []
        while (tok := peek()) is not None and tok != ")" and tok.lower() != "or":
            if tok.lower() == "and":
                at += 1
                nxt = peek()
                if not items or nxt is None or nxt == ")" or nxt.lower() in ("and", "or"):
                    raise FilterError(f"filter {_quoted(q)}: 'and' needs a term on each side")
                continue
            items.append(atom())
        if not items:
            raise FilterError(f"filter {_quoted(q)}: 'or' and parentheses need a term on each side (or inside)")
        return Expr("and", items)

    def alternatives() -> Expr:
        nonlocal at
        items = [conjunction()]
        while (tok := peek()) is not None and tok.lower() == "or":
            at += 1
            items.append(conjunction())
        return Expr("or", items)

    if not toks:
        return Expr("and", [])
    out = alternatives()
    if at != len(toks):
        raise FilterError(f"filter {_quoted(q)}: a ')' closes nothing")
    return out


def _quoted(q: str) -> str:
    """A filter as an error quotes it: a long one cut short."""
    return repr(q) if len(q) <= 120 else repr(q[:100]) + f"… ({len(q)} characters)"


def _term(tok: str) -> Term:
    body = tok[1:] if tok.startswith("-") else tok
    name, colon, value = body.partition(":")
    if colon and name.lower() == "tag":
        if not value:
            raise FilterError(f"filter term {tok!r}: {tok[: len(tok) - len(body)]}tag: needs a tag's name "
                              f"(tag:baseline; -tag:baseline for the runs without it)")
        return Term(tok, column="tag", op=":", value=_unquoted(value)[0], negated=body is not tok)
    name, colon, value = tok.partition(":")
    if colon and value and ALIASES.get(name, name) in FIXED_COLUMNS and not _TERM_RE.match(tok):
        tok = f"{name}={value}"
    return _one_term(tok)


def leaves(e: Any) -> list[Term]:
    """Every term of an expression, in order."""
    return [t for item in e.items for t in leaves(item)] if isinstance(e, Expr) else [e]


def tags_of(r: RunInfo) -> tuple[str, ...]:
    """A run's tags (``RunInfo.tags`` where there is one, else the manifest's ``tags``), only strings."""
    got = getattr(r, "tags", None)
    if got is None:
        got = r.manifest.get("tags")
    return tuple(t for t in got if type(t) is str) if isinstance(got, (list, tuple)) else ()


def _current_tags(store: Any) -> Callable[[RunInfo], tuple[str, ...]]:
    """Each run's tags as they are now: its manifest's, with every edit (one read of all of them) applied."""
    from casmon.runs import tags

    edits = tags.edits_by_run(store)
    return lambda r: tags.merged(r.manifest, edits.get(r.ref, []))[0]


def compile_query(e: Expr, rows: list[dict[str, Any]],
                  tags: Callable[[RunInfo], tuple[str, ...]] = tags_of) -> Callable[[RunInfo, dict[str, Any]], bool]:
    """The filter as one test of a run and its row (terms resolved against the rows' columns); ``tags`` gives
    a run's tags for ``tag:`` terms."""
    plain = [t for t in leaves(e) if t.op != ":"]
    known = {c for row in rows for c in row}
    tests = dict(zip(map(id, plain), compile_terms(resolve(plain, known), rows)))

    def build(x: Any) -> Callable[[RunInfo, dict[str, Any]], bool]:
        if isinstance(x, Expr):
            parts = [build(i) for i in x.items]
            if x.op == "or":
                return lambda r, row: any(p(r, row) for p in parts)
            return lambda r, row: all(p(r, row) for p in parts)
        if x.op == ":":
            want, negated = x.value, x.negated
            return lambda r, row: (want in tags(r)) != negated
        test = tests[id(x)]
        return lambda r, row: test(row)

    return build(e)


def _bare(col: str) -> str:
    """``metric.loss`` -> ``loss``; a fixed column as it is."""
    for p, _ in GROUPS:
        if col.startswith(p):
            return col[len(p):]
    return col


def resolve(terms: list[Term], known: set[str]) -> list[Term]:
    """Each comparison's column as the rows name it (``loss`` -> ``metric.loss``).

    A fixed column by its name or its header (``start``, ``started``); a prefixed name (``param.lr``) as it
    is; a bare name when exactly one group has it. A bare name that two groups have (a parameter ``loss``
    and a metric ``loss``, in one run or across runs) is a :class:`FilterError` naming the prefixed names
    to write, never one of them chosen quietly; so is a name no run has."""
    out = []
    for t in terms:
        if t.word:
            out.append(t)
            continue
        name = ALIASES.get(t.column, t.column)
        if name in FIXED_COLUMNS or (name in known and is_column(name)):
            out.append(Term(t.text, column=name, op=t.op, value=t.value))
            continue
        found = [p + name for p, _ in GROUPS if p + name in known]
        if len(found) > 1:
            what = " and ".join(dict.fromkeys(_GROUP_WORDS[c.split(".", 1)[0]] for c in found))
            raise AmbiguousColumn(f"filter term {t.text!r}: {name!r} is both {what} (in these runs); name the one you mean: "
                              + " or ".join(f"{c}{t.op}{t.value}" for c in found))
        if found:
            out.append(Term(t.text, column=found[0], op=t.op, value=t.value))
            continue
        if name.lower() == "tag":
            raise FilterError(f"filter term {t.text!r}: a tag is found with tag:NAME, and the runs without it with "
                              f"-tag:NAME (no run has a column 'tag')")
        names = sorted({_bare(c) for c in known | set(FIXED_COLUMNS) if is_column(c)})
        close = difflib.get_close_matches(name, names, 3)
        raise FilterError(f"filter term {t.text!r}: no run has a column {t.column!r}"
                          + (f" (did you mean {', '.join(close)}?)" if close else
                             f" (columns: {', '.join(names[:30])}{', …' if len(names) > 30 else ''})"))
    return out


#: What a group's values are, in an error that names two of them.
_GROUP_WORDS = {"param": "a parameter", "info": "an info value", "metric": "a metric"}
#: Column names a filter takes besides the columns' own: the headers the table shows.
ALIASES = {"started": "start"}
#: How a filter writes a yes/no value (the table shows ``yes``).
BOOL_WORDS = {"yes": True, "true": True, "no": False, "false": False}
#: Statuses a run can have (a filter on another is a typo, not an empty table).
STATUSES = ("running", "ok", "failed", "killed", "lost", "claimed", "unreadable", "damaged")
_HEX_RE = re.compile(r"^[0-9a-fA-F]{4,40}$")
#: ISO dates and times a filter on ``start`` takes, and how much of a time each names.
_TIME_FORMATS = [("%Y-%m-%d", 86400.0), ("%Y-%m-%dT%H", 3600.0), ("%Y-%m-%dT%H:%M", 60.0),
                 ("%Y-%m-%dT%H:%M:%S", 1.0)]


def _as_number(s: str) -> float | None:
    try:
        x = float(s)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


#: A filter's comparisons.
_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _as_time(term: Term) -> tuple[float, float]:
    """The span of time a ``start`` value names, ``[lo, hi)`` in Unix seconds: a day, an hour, a minute or a
    second, in local time as the table shows it (or Unix seconds, as a number)."""
    x = _as_number(term.value)
    if x is not None:
        return x, x
    v = term.value.replace(" ", "T")
    for fmt, span in _TIME_FORMATS:
        try:
            t = _dt.datetime.strptime(v, fmt)
        except ValueError:
            continue
        lo = t.timestamp()  # naive: local time, as the table shows it
        return lo, lo + span
    try:
        t = _dt.datetime.fromisoformat(v)  # fractions of a second, a time zone (+01:00, Z)
    except ValueError:
        raise FilterError(f"filter term {term.text!r}: {term.column} is a date and time: write it as the table "
                          f"shows it, in local time, with T for the space (start>2026-12-02, "
                          f"start>=2026-12-02T14:30, start<2026-12-02T14:30:05), or as Unix seconds") from None
    lo = t.timestamp()
    return lo, lo


def _time_test(op: str, lo: float, hi: float) -> Callable[[Any], bool]:
    """A comparison with a span: ``=`` within it, ``<`` before it, ``>`` after it (``start>2026-12-02``: from
    the next day on; ``start>=2026-12-02``: from that day on)."""
    if hi <= lo:  # an instant
        return lambda v: _COMPARISONS[op](float(v), lo)
    return {"=": lambda v: lo <= v < hi, "!=": lambda v: not lo <= v < hi, "<": lambda v: v < lo,
            "<=": lambda v: v < hi, ">": lambda v: v >= hi, ">=": lambda v: v >= lo}[op]


def _kind(values: list[Any]) -> str:
    """``number``, ``bool``, ``text``, ``mixed`` or ``none``: what a column's (non-empty) cells hold."""
    kinds = {"bool" if type(v) is bool else "number" if is_number(v) else "text" for v in values}
    return kinds.pop() if len(kinds) == 1 else "mixed" if kinds else "none"


def compile_terms(terms: list[Term], rows: list[dict[str, Any]]) -> list[Callable[[dict[str, Any]], bool]]:
    """Each term as a test of a row (``terms`` resolved: see :func:`resolve`). A value the column's cells
    cannot be compared with is a :class:`FilterError` that says so (``lr<abc``, ``dirty=maybe``), never a
    comparison of text that quietly matches nothing: numbers compare as numbers, ``start`` with dates and
    times, ``dirty`` and other yes/no columns with yes/no/true/false, ``commit`` by a prefix of the hash."""
    tests: list[Callable[[dict[str, Any]], bool]] = []
    for t in terms:
        if t.word:
            tests.append(_word_test(t.word))
            continue
        tests.append(_compile(t, [row.get(t.column) for row in rows]))
    return tests


def _word_test(word: str) -> Callable[[dict[str, Any]], bool]:
    def found(row: dict[str, Any]) -> bool:
        return word in " ".join(str(v) for v in row.values() if v is not None).lower()
    return found


def _compile(t: Term, cells: list[Any]) -> Callable[[dict[str, Any]], bool]:
    col, op, value = t.column, t.op, t.value
    present = [v for v in cells if v is not None and v != ""]
    kind = _kind(present)
    label = "started" if col == "start" else col

    def cell(test: Callable[[Any], bool], want: Callable[[Any], bool]) -> Callable[[dict[str, Any]], bool]:
        def check(row: dict[str, Any]) -> bool:
            v = row.get(col)
            return v is not None and want(v) and test(v)
        return check

    if col == "start":
        lo, hi = _as_time(t)
        return cell(_time_test(op, lo, hi), is_number)
    if col == "commit":
        if op not in ("=", "!="):
            raise FilterError(f"filter term {t.text!r}: a commit is found by its hash or a prefix of it, with = or "
                              f"!= (commit=99b3052)")
        if not _HEX_RE.match(value):
            raise FilterError(f"filter term {t.text!r}: {value!r} is not a commit hash or a prefix of one "
                              f"(4 to 40 hexadecimal digits, as git takes)")
        prefix = value.lower()
        found = (lambda v: str(v).lower().startswith(prefix)) if op == "=" else \
            (lambda v: not str(v).lower().startswith(prefix))
        return cell(found, lambda v: type(v) is str and v != "")
    if col == "dirty" or kind == "bool":
        if op not in ("=", "!="):
            raise FilterError(f"filter term {t.text!r}: {label} is yes or no: compare it with = or != "
                              f"({label}=yes, {label}!=no)")
        want = BOOL_WORDS.get(value.lower())
        if want is None:
            raise FilterError(f"filter term {t.text!r}: {label} is yes or no, not {value!r} "
                              f"(write yes, no, true or false)")
        return cell(lambda v: (v is want) == (op == "="), lambda v: type(v) is bool)
    if col == "status":
        if op in ("=", "!=") and value not in STATUSES and value not in present:
            raise FilterError(f"filter term {t.text!r}: no status {value!r} (statuses: {', '.join(STATUSES)})")
    num = _as_number(value)
    if col == "duration" or kind == "number":
        if num is None:
            what = "a duration in seconds (duration>60)" if col == "duration" else f"numbers ({label}{op}0.3)"
            raise FilterError(f"filter term {t.text!r}: {label} holds {what}; {value!r} is not a number")
        return cell(lambda v: _COMPARISONS[op](float(v), num), lambda v: is_number(v))
    if kind == "mixed" and num is not None:  # numbers and text in one column: a number compares with numbers
        return cell(lambda v: _COMPARISONS[op](float(v), num), lambda v: is_number(v))
    if kind == "mixed" and op not in ("=", "!="):
        raise FilterError(f"filter term {t.text!r}: {label} holds numbers and text; {value!r} is not a number, "
                          f"so only = and != compare it (with the text cells)")
    return cell(lambda v: _COMPARISONS[op](str(v), value), lambda v: type(v) is str)


def matches(row: dict[str, Any], terms: list[Term]) -> bool:
    """One row passes every resolved term (each column's kind read from this row alone; a table compiles its
    terms against all of its rows, :func:`compile_terms`)."""
    return all(test(row) for test in compile_terms(terms, [row]))


@dataclass
class RunsView:
    rows: list[tuple[Entry, RunInfo, dict[str, Any]]]
    params: list[str]  # param.KEY then info.KEY columns, each sorted
    metrics: list[str]  # metric.KEY columns, sorted, the sampled sys/ ones last
    total: int  # runs that match
    all_runs: int
    page: int
    pages: int
    serial: int  # the index's change counter when the view was made (the page's live updates start there)
    error: str = ""  # what is wrong with the filter (the table then shows every run)
    cut: int = 0  # columns left out past the limits
    sort_note: str = ""  # why the rows are not sorted (no run has the column)


def _sorted_rows(rows: list[tuple[Entry, RunInfo, dict[str, Any]]], sort: str,
                 desc: bool) -> list[tuple[Entry, RunInfo, dict[str, Any]]]:
    order = _order([x[0] for x in rows], None if sort == "run" else [x[2].get(sort) for x in rows], sort, desc)
    return [rows[i] for i in order]


def _order(entries: list[Entry], values: list[Any] | None, sort: str, desc: bool) -> list[int]:
    """The positions of ``entries`` in the table's order by column ``sort`` (its cells ``values``; the run's
    number for ``run``): NaN, then empty cells, last either way."""
    if values is None:
        return sorted(range(len(entries)), key=lambda i: run_number(entries[i].tail), reverse=desc)
    keys = [sort_key(v) for v in values]
    present = [i for i, k in enumerate(keys) if k[0] < 2]
    present.sort(key=keys.__getitem__, reverse=desc)
    last = sorted((i for i, k in enumerate(keys) if k[0] >= 2), key=lambda i: keys[i][0])
    return present + last


#: Columns a sort reads from the listing and the runs index alone (no run's row made but those shown).
_LISTED = ("run", "start", "status")


def _column(index: RunIndex, entries: list[Entry], sort: str) -> list[Any] | None:
    """Every run's cell of column ``sort`` as its row would hold it, from the listing and the runs index's
    columns (a run the index does not hold: from its row); None for a column they do not hold."""
    if sort == "run":
        return None
    if sort.startswith("metric."):
        name = sort[len("metric."):]
        out = []
        for e in entries:
            got = index.indexed_cell(e, name)
            out.append(got[0] if got is not None else index.row(e, row_of)[1].get(sort))
        return out
    if sort.startswith(("param.", "info.")):
        field, key = ("params", sort[len("param."):]) if sort.startswith("param.") else ("info", sort[len("info."):])
        out = []
        for e in entries:
            ie = None if e.status in LIVE_STATUSES else index.indexed(e)
            got = ie[4][0].flat(ie[4][1], (sort,)) if ie is not None and type(ie[4]) is tuple else None
            if got is not None:
                out.append(got.get(sort))
                continue
            v = _flat_cell(ie, field, key) if ie is not None and type(ie[2]) is str else _NOT_HERE
            out.append(index.row(e, row_of)[1].get(sort) if v is _NOT_HERE else v)
        return out
    if sort not in _LISTED:
        return None
    return [index.row(e, row_of)[1].get(sort) if e.status in LIVE_STATUSES or index.indexed(e) is None
            else (e.start if sort == "start" else e.status) for e in entries]


_NOT_HERE = object()


def _flat_cell(slim: list[Any], field: str, key: str) -> Any:
    """The cell ``param.KEY`` or ``info.KEY`` that :func:`row_of` makes of runs index entry ``slim``, read from
    its manifest text alone (parsed and checked as the row's would be); ``_NOT_HERE`` where only the run's row
    can say (a stored value among the parameters, a
    cell that is not a scalar, text that is not a manifest's)."""
    if field == "params" and '"$"' in slim[2]:
        return _NOT_HERE
    m = runs_index.slim(slim, f"runs index entry {slim[6]}")  # what the run's row would be made of, checked
    got = m.get(field, {}) if m is not None else None
    if type(got) is not dict:
        return _NOT_HERE
    v = flatten(got).get(key)
    if is_scalar(v):
        return v
    return None if field == "info" else _NOT_HERE


def _filtered_from_columns(index: RunIndex, entries: list[Entry], query: Expr, terms: list[Term], tagged: bool,
                           sort: str) -> list[tuple[Entry, Any, dict[str, Any]]] | None:
    """The runs that pass ``query``, each with the cells its terms and the sort name, made from the listing and
    the runs index's columns for the runs the index holds (each manifest's text parsed once, no row made);
    None where the query needs every cell (a word) or a column only rows hold, or cannot be applied (the full
    path then says why, naming what a full row would)."""
    if any(t.word for t in terms):
        return None
    wanted: set[str] = set()
    for name in [ALIASES.get(t.column, t.column) for t in terms if t.op != ":"] + [sort]:
        if name in FIXED_COLUMNS:
            if name not in _LISTED:
                return None
            wanted.add(name)
        elif is_column(name):
            wanted.add(name)
        else:
            wanted.update(p + name for p, _ in GROUPS)
    from casmon.runs import tags as run_tags

    edits = run_tags.edits_by_run(index.store) if tagged else None
    parse = tagged or any(c.startswith(("param.", "info.")) for c in wanted)
    # Each run's cells, and what its tags start from (its manifest's, or its manifest), kept while the listing
    # stands: a filter typed again, or another over the same columns, parses no manifest text again.
    key = (getattr(entries, "serial", None), frozenset(wanted), parse)
    made = index.cells.get(key)
    if made is None:
        made = []
        flat = [c for c in wanted if c.startswith(("param.", "info."))]
        for e in entries:
            ie = None if e.status in LIVE_STATUSES else index.indexed(e)
            row: dict[Any, Any] | None = None
            start: Any = None
            got = _from_columns(index, e, ie, wanted, flat, tagged) if ie is not None else None
            if got is not None:  # the columns' tags, with the run's manifest to apply any edit to
                made.append((e, ie, got[0], got[1]))
                continue
            if ie is not None and type(ie[2]) is str:
                row = _cells_of(index, e, ie, wanted, parse)
                m = row.pop(_MANIFEST, None) if row is not None else None
                if m is not None:
                    start = {"start": m.get("start"), "tags": m.get("tags")}
            if row is None:
                r, row = index.row(e, row_of)
                start = r.manifest
            made.append((e, start, row, None))
        if key[0] is not None:
            index.cells[key] = made
            while len(index.cells) > 4:
                index.cells.pop(next(iter(index.cells)))
    out: list[tuple[Entry, Any, dict[str, Any]]] = []
    for e, start, row, base in made:
        if edits is None:
            out.append((e, (), row))
        elif base is not None and e.ref not in edits:
            out.append((e, base, row))
        else:
            if base is not None:  # a run with tag edits: its manifest's tags with them applied, as its row has
                m = runs_index.slim(start, f"runs index entry {e.ref}")
                start = {"start": m.get("start"), "tags": m.get("tags")} if m is not None else \
                    index.row(e, row_of)[0].manifest
            out.append((e, run_tags.merged(start, edits.get(e.ref, []))[0] if start is not None else (), row))
    try:
        # Each run stands as its tags here: a tag: term asks the "run" for them.
        test = compile_query(query, [row for _e, _t, row in out], lambda got: got)  # type: ignore[arg-type,return-value]
    except AmbiguousColumn:
        raise  # each of the two columns is in these cells as it is in the rows
    except FilterError:
        return None  # said by the full path, with every column a row has
    return [x for x in out if test(x[1], x[2])]


def _from_columns(index: RunIndex, e: Entry, ie: list[Any], wanted: set[str], flat: list[str],
                  tagged: bool) -> tuple[dict[str, Any], tuple[str, ...]] | None:
    """``(the wanted cells, the tags its manifest gives)`` of ended run ``e`` from the runs index's columns, no
    manifest parsed; None where the columns do not hold them (a run just read, a stored value or a list among
    its parameters, a key past the columns' fields: its manifest or row says)."""
    if type(ie[4]) is not tuple:
        return None
    cols, i = ie[4]
    row = cols.flat(i, flat)
    tags = cols.tags(i) if tagged else ()
    if row is None or tags is None:
        return None
    for c in wanted:
        if (c in _LISTED or c.startswith("metric.")) and not _put_indexed(index, e, c, row):
            return None
    return row, tags


def _put_indexed(index: RunIndex, e: Entry, c: str, row: dict[Any, Any]) -> bool:
    """Put cell ``c`` (a listed field or a metric) of ended run ``e`` into ``row`` from its entry and the runs
    index's columns (nothing where the run did not log the metric); False where the columns do not hold it."""
    if c in _LISTED:
        row[c] = e.name if c == "run" else e.start if c == "start" else e.status
        return True
    got = index.indexed_cell(e, c[len("metric."):])
    if got is None:
        return False
    if got[0] is not None:
        row[c] = got[0]
    return True


_MANIFEST = object()  # where _cells_of leaves the parsed manifest text


def _cells_of(index: RunIndex, e: Entry, ie: list[Any], wanted: set[str], parse: bool) -> dict[Any, Any] | None:
    """The ``wanted`` cells of ended run ``e``'s row, made from its runs index entry ``ie`` (None where only
    the row can say); the manifest text parsed once (left under ``_MANIFEST``) if ``parse``."""
    row: dict[Any, Any] = {}
    m: Any = None
    flat: dict[str, Any] = {}
    if parse:
        m = runs_index.slim(ie, f"runs index entry {e.ref}")  # what the run's row would be made of, checked
        if m is None:
            return None  # an entry the row is not made from: the row says
        row[_MANIFEST] = m
    for c in wanted:
        if c in _LISTED or c.startswith("metric."):
            if not _put_indexed(index, e, c, row):
                return None
        else:
            field = "params" if c.startswith("param.") else "info"
            if field not in flat:
                d = m.get(field, {})
                if type(d) is not dict or field == "params" and '"$"' in ie[2]:
                    return None  # a stored value among the parameters, a crafted field: the row says
                flat[field] = flatten(d)
            key = c.split(".", 1)[1]
            if key in flat[field]:
                v = flat[field][key]
                if not is_scalar(v):
                    if field == "params":
                        return None
                    continue
                row[c] = v
    return row


def _from_rows(index: RunIndex, entries: list[Entry], query: Expr, terms: list[Term], tagged: bool, sort: str,
               desc: bool, error: str) -> tuple[list[Entry], str]:
    """The runs that pass ``query`` in order, made from every run's row (from the index where it holds the run),
    and what is wrong with the filter."""
    fast = None
    if terms and not error:
        try:
            fast = _filtered_from_columns(index, entries, query, terms, tagged, sort)
        except AmbiguousColumn as e:  # what a full row would say too: every run is shown
            error = str(e)
    if (not terms or error) and (sort in _LISTED or sort.startswith(("metric.", "param.", "info."))):
        return [entries[i] for i in _order(entries, _column(index, entries, sort), sort, desc)], error
    if fast is not None:
        return [x[0] for x in _sorted_rows(fast, sort, desc)], error
    every = [(e, *index.row(e, row_of)) for e in entries]
    if terms and not error:
        try:
            test = compile_query(query, [row for _e, _r, row in every],
                                 _current_tags(index.store) if tagged else tags_of)
            every = [x for x in every if test(x[1], x[2])]
        except FilterError as e:
            error = str(e)
    return [x[0] for x in _sorted_rows(every, sort, desc)], error


def runs_view(index: RunIndex, sort: str = "start", desc: bool = True, q: str = "", page: int = 1,
              per: int = 50) -> RunsView:
    """One page of the runs table. The default order (by start), and a sort by run, status, start or a metric
    without a filter, read no manifest and make only the shown page's rows (from the listing and the runs
    index's columns); another sort or a filter makes every run's row (from the index where it holds the run).
    A bad filter gives every run, and ``error`` says what is wrong with it."""
    entries = index.entries()
    serial = entries.changes
    error = ""
    try:
        query = parse_query(q)
    except FilterError as e:
        query, error = Expr("and", []), str(e)
    terms = leaves(query)
    tagged = any(t.op == ":" for t in terms)
    if sort == "start" and not terms:
        chosen = list(reversed(entries)) if desc else list(entries)
    else:
        key = (entries.serial, sort, desc, q)
        # Tags change by edit records, not in the listing its serial follows: a tag filter's view is made anew
        # (every run's edits read once), never kept.
        cached = None if tagged else index.views.get(key)
        if cached is None:
            sort = sort if is_column(sort) else "start"
            from casmon.ui import vectors

            try:
                cached = vectors.view(index, entries, query, sort, desc, tagged)
            except AmbiguousColumn as e:  # what a full row would say too: every run is shown
                error = str(e)
                cached = vectors.view(index, entries, None, sort, desc, False)
            if cached is None:  # a word, a column only rows hold, a term the rows must explain
                cached, error = _from_rows(index, entries, query, terms, tagged, sort, desc, error)
            if index.complete(entries) and not error and not tagged:  # valid while this listing is
                index.views[key] = cached
                while len(index.views) > 8:
                    index.views.pop(next(iter(index.views)))
        chosen = cached
    total = len(chosen)
    pages = max(1, math.ceil(total / per))
    page = min(max(page, 1), pages)
    rows = [(e, *index.row(e, row_of)) for e in chosen[(page - 1) * per: page * per]]
    seen = {k for _e, _r, row in rows for k in row}
    params = sorted(k for k in seen if k.startswith("param.")) + sorted(k for k in seen if k.startswith("info."))
    metrics = users_first((k for k in seen if k.startswith("metric.")), "metric.")  # sys/ ones last
    cut = max(0, len(params) - MAX_PARAM_COLUMNS) + max(0, len(metrics) - MAX_METRIC_COLUMNS)
    return RunsView(rows, params[:MAX_PARAM_COLUMNS], metrics[:MAX_METRIC_COLUMNS], total, len(entries), page, pages,
                    serial, error, cut, _sort_note(index, chosen, rows, sort, bool(terms) and not error))


def _sort_note(index: RunIndex, chosen: list[Entry], rows: list[tuple[Entry, RunInfo, dict[str, Any]]], sort: str,
               filtered: bool) -> str:
    """What the table says where no run shown has the sorted column: empty cells sort last, so the first run
    in the order lacks it only then."""
    if not chosen or sort in FIXED_COLUMNS or not is_column(sort):
        return ""
    first = rows[0][2] if rows and rows[0][0] is chosen[0] else index.row(chosen[0], row_of)[1]
    if first.get(sort) is not None:
        return ""
    return f"sort: no run{' that matches' if filtered else ''} has a column {sort!r}, so the rows are not sorted"
