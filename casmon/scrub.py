"""The one scrubber for everything casmon keeps about a process: argv, environment values, URLs, errors, output.

Every place that stores text which may carry a credential goes through here:
the call log's session record and its ``calllog/sessions/*`` ref, a run's
manifest (command line, environment values, traceback, error, console
output), and the exception messages the call log keeps.

What is removed, whole (never just up to an odd character):

* the user information of a URL, ``scheme://user:password@host`` becoming
  ``scheme://***@host``, however many ``@``, ``:`` or ``/`` the password holds
  (everything up to the *last* ``@`` of the URL goes; in an argv element or an
  environment value the URL may even hold spaces);
* values of secret-looking options and assignments: ``--password=…``,
  ``--api-key …`` (the next argv element), ``TOKEN=…``, ``?sig=…&``;
* ``Bearer``/``Basic`` authorization values;
* the value of every environment variable of this process whose name looks
  like a secret (``AWS_SECRET_ACCESS_KEY``, ``GITHUB_TOKEN``, ...), wherever it
  appears (a shell expanded it into argv, a library printed it), if it is at
  least 6 characters long.

A store's own location is cleaned by :func:`scrub_url`, which removes its user
information rather than masking it (``s3://key:secret@bucket/x`` is shown,
kept and opened as ``s3://bucket/x``; the credentials come from the
environment or ``storage_options``).

Scrubbing is one-way and deliberately eager: a non-secret that looks like one
(``https://host/?email=a@b``) is scrubbed too.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any


class _LazyPattern:
    """A regular expression compiled on first use: these take milliseconds to compile, and a process that
    never scrubs a text (a cache hit) need not pay for them."""

    __slots__ = ("_args", "_compiled")

    def __init__(self, *args: Any) -> None:
        self._args = args
        self._compiled: re.Pattern[str] | None = None

    def _re(self) -> re.Pattern[str]:
        c = self._compiled
        if c is None:
            c = self._compiled = re.compile(*self._args)
        return c

    def sub(self, repl: str | Callable[[re.Match[str]], str], string: str, count: int = 0) -> str:
        return self._re().sub(repl, string, count)

    def search(self, string: str) -> re.Match[str] | None:
        return self._re().search(string)

    def match(self, string: str) -> re.Match[str] | None:
        return self._re().match(string)

    def finditer(self, string: str) -> Iterator[re.Match[str]]:
        return self._re().finditer(string)

__all__ = ["MASK", "looks_secret", "scrub", "scrub_argv", "scrub_env", "scrub_output", "scrub_url", "secret_values"]

MASK = "***"

#: Names of options, variables and query parameters whose values are secrets.
# (not "tokens", "tokenizer" or "author": common, harmless option names in ML scripts)
_SECRET_WORDS = (r"secret|token(?![a-z])|passw|passphrase|credential|api[_-]?key|apikey|access[_-]?key|private[_-]?key"
                 r"|auth(?!or)|session[_-]?id|cookie|signature|client[_-]?key")
_SECRET_NAME = _LazyPattern(rf"(?i)({_SECRET_WORDS}|^pwd$|^pass$|^sig$|^key$)")
# scheme://userinfo@ : greedy, so the *last* '@' of the URL ends the userinfo
_URL_TEXT = _LazyPattern(r"(?i)\b([a-z][a-z0-9+.-]*://)\S*@")
_URL_WHOLE = _LazyPattern(r"(?is)\b([a-z][a-z0-9+.-]*://).*@")
# NAME=value and --name=value with a secret-looking name; the value runs to whitespace (text) or the end (argv)
_ASSIGN_TEXT = _LazyPattern(rf"(?i)([\w.-]*(?:{_SECRET_WORDS})[\w.-]*\s*[=:]\s*)(?!\*\*\*)[^\s&]+")
_ASSIGN_WHOLE = _LazyPattern(rf"(?is)^(-{{0,2}}[\w.-]*(?:{_SECRET_WORDS})[\w.-]*=).+$")
_QUERY = _LazyPattern(rf"(?i)([?&;](?:[\w.-]*(?:{_SECRET_WORDS})[\w.-]*|sig|key|pass|pwd)=)[^&#\s]+")
_BEARER = _LazyPattern(r"(?i)\b(bearer|basic)(\s+)(?!\*\*\*)[A-Za-z0-9._~+/=-]{6,}")
_FLAG = _LazyPattern(rf"(?i)^-{{1,2}}[\w.-]*(?:{_SECRET_WORDS})[\w.-]*$|^-{{1,2}}(?:pass|pwd|key|sig)$")


def looks_secret(name: str) -> bool:
    """True if a variable, option or parameter of this name probably holds a secret."""
    return bool(_SECRET_NAME.search(name.strip("-").split("=", 1)[0]))


def secret_values(environ: Mapping[str, str] | None = None, argv: Iterable[str] | None = None) -> list[str]:
    """Secrets this process holds, longest first: values of secret-looking environment variables (at least 6
    characters) and what :func:`scrub_argv` masks in this process's command line (at least 4), so a program
    that prints its own argv or environment does not leak them into its captured output."""
    env = os.environ if environ is None else environ
    vals = {v for k, v in env.items() if v and len(v) >= 6 and looks_secret(k) and k not in ("PWD", "OLDPWD")}
    vals.update(_argv_secrets(tuple(sys.argv if argv is None else argv)))
    return sorted(vals, key=len, reverse=True)


@functools.lru_cache(maxsize=8)
def _argv_secrets(argv: tuple[str, ...]) -> frozenset[str]:
    found: set[str] = set()
    mask_next = False
    for a in argv:
        s = str(a)
        if mask_next:
            found.add(s)
            mask_next = False
            continue
        if _FLAG.match(s):
            mask_next = True
            continue
        for rx in (_URL_WHOLE, _ASSIGN_WHOLE):
            for m in rx.finditer(s):
                secret = m.group(0)[len(m.group(1)):].rstrip("@")
                found.add(secret)
                if rx is _URL_WHOLE and ":" in secret:
                    found.add(secret.split(":", 1)[1])  # the password alone
        for m in _QUERY.finditer(s):
            found.add(m.group(0)[len(m.group(1)):])
        for m in _BEARER.finditer(s):
            found.add(m.group(0)[len(m.group(1)) + len(m.group(2)):])
    return frozenset(x for x in found if len(x) >= 4 and x != MASK)


def _known(text: str, environ: Mapping[str, str] | None) -> str:
    for v in secret_values(environ):
        if v in text:
            text = text.replace(v, MASK)
    return text


def scrub(text: str, *, whole: bool = False, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with credentials removed.

    ``whole=True`` treats ``text`` as one argv element or one environment value:
    a URL's user information or an assignment's value may then hold spaces.
    """
    if not isinstance(text, str):
        text = str(text)
    text = _known(text, environ)
    if whole:
        text = _URL_WHOLE.sub(lambda m: m.group(1) + MASK + "@", text)
        text = _ASSIGN_WHOLE.sub(lambda m: m.group(1) + MASK, text)
    text = _URL_TEXT.sub(lambda m: m.group(1) + MASK + "@", text)
    text = _QUERY.sub(lambda m: m.group(1) + MASK, text)
    text = _BEARER.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    text = _ASSIGN_TEXT.sub(lambda m: m.group(1) + MASK, text)
    return text


_SCHEME = _LazyPattern(r"(?is)^([a-z][a-z0-9+.-]*://)(.*)$")


def scrub_url(url: str) -> str:
    """A store location fit to show, keep and open: a URL's user information removed whole.

    The user information runs to the URL's *last* ``@``, so a password may hold ``/``, ``@`` and
    ``:`` (``s3://user:pa/ss@bucket/x`` becomes ``s3://bucket/x``). An ``@`` after a ``/`` is part
    of the path when no ``:`` comes before that ``/`` (``s3://bucket/run@2/x`` stays as it is): a
    password always follows a ``user:``. Paths and other text are returned unchanged.
    """
    m = _SCHEME.match(url)
    if m is None:
        return url
    scheme, rest = m.groups()
    cut = rest.rfind("@")
    if cut < 0:
        return url
    userinfo = rest[:cut]
    if "/" in userinfo and ":" not in userinfo.split("/", 1)[0]:
        return url
    return scheme + rest[cut + 1 :]


def scrub_output(text: str, environ: Mapping[str, str] | None = None) -> str:
    """Console output and tracebacks: URL credentials, secret query parameters, ``Bearer`` values and the
    values of secret environment variables go; ``NAME=value`` text stays (``tokens=512`` is not a secret)."""
    text = _known(text, environ)
    text = _URL_TEXT.sub(lambda m: m.group(1) + MASK + "@", text)
    text = _QUERY.sub(lambda m: m.group(1) + MASK, text)
    return _BEARER.sub(lambda m: m.group(1) + m.group(2) + MASK, text)


def scrub_argv(argv: Iterable[object], environ: Mapping[str, str] | None = None) -> list[str]:
    """A command line with credentials removed; the element after ``--password``-like flags is masked whole."""
    out: list[str] = []
    mask_next = False
    for a in argv:
        s = str(a)
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        if _FLAG.match(s):
            mask_next = True
            out.append(s)
            continue
        out.append(scrub(s, whole=True, environ=environ))
    return out


def scrub_env(env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment values with credentials removed; a secret-looking name's value is masked whole."""
    return {k: (MASK if looks_secret(k) else scrub(str(v), whole=True, environ=environ)) for k, v in env.items()}
