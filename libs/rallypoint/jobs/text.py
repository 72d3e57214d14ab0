"""Which strings a request may carry: one rule for every field of every endpoint. Pure.

Every string a client sends ends up somewhere a reader must apply it: an event in the log, a PostgreSQL
``text`` column (which refuses NUL outright), an ``exec()`` of the ranks (where a NUL ends the string),
a terminal that shows ``rally jobs`` (where an escape sequence repaints the screen). So every string of
every request is held to the same rule before anything is appended:

- never a NUL, another C0 or C1 control character, or DEL (U+0000-U+001F, U+007F-U+009F);
- never a lone surrogate (U+D800-U+DFFF): what an invalid UTF-8 byte or half of a ``\\u`` pair decodes
  to; UTF-8 cannot encode it, so no reader downstream could store it;
- never a bidirectional formatting character (U+202A-U+202E, U+2066-U+2069): it reorders what an
  operator reads in a listing or a log ("Trojan Source");
- except that a *free-text* field (a command argument, an environment value, an operator's reason) may
  hold a tab or a newline: a ``sh -c`` script or a PEM value has them. Ids, names, teams, types, paths and
  keys may not.

``SpecError`` lives here, the lowest module of the package, because every check of a request's input
raises it, this one first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping

#: The characters no string may hold besides lone surrogates (a regex class body): a free-text field may
#: hold a tab and a newline, which every other field refuses too.
FORBIDDEN = "\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f\\u202a-\\u202e\\u2066-\\u2069"
_SURROGATES = "\\ud800-\\udfff"
_ANY_FIELD = re.compile(f"[{FORBIDDEN}{_SURROGATES}\\t\\n]")
_FREE_TEXT = re.compile(f"[{FORBIDDEN}{_SURROGATES}]")
_SURROGATE = re.compile(f"[{_SURROGATES}]")

#: The same rule as JSON Schema patterns (ECMA 262), for the OpenAPI document. Without the surrogates:
#: JSON Schema validators refuse a pattern that names them, and no UTF-8 text holds one anyway.
CLEAN_TEXT_PATTERN = f"^[^{FORBIDDEN}\\t\\n]*$"
FREE_TEXT_PATTERN = f"^[^{FORBIDDEN}]*$"

_WHITESPACE_NAMES = {"\t": "tab", "\n": "newline"}
_SHOWN_KEY = 64  # characters of an offending key quoted back in a detail


class SpecError(ValueError):
    """A request that can never be accepted; ``field`` names the offending field."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


def _describe(char: str) -> str:
    code = f"U+{ord(char):04X}"
    if char == "\x00":
        return f"a NUL character ({code})"
    if "\ud800" <= char <= "\udfff":
        return f"invalid UTF-8 (a byte that is not UTF-8, or half a surrogate pair: {code})"
    if char in _WHITESPACE_NAMES:
        return f"a {_WHITESPACE_NAMES[char]} ({code}; only free text may hold one)"
    if "\u202a" <= char <= "\u2069":
        return f"a bidirectional formatting character ({code})"
    return f"a control character ({code})"


#: A rule over one string: why it may not be accepted, or None; the flag says it is free text.
Fault = Callable[[str, bool], "str | None"]


def _first(pattern: re.Pattern[str], value: str) -> str | None:
    found = pattern.search(value)
    if found is None:
        return None
    return f"holds {_describe(found.group())} at character {found.start()}"


def text_fault(value: str, free_text: bool = False) -> str | None:
    """Why ``value`` may not be accepted (its first offending character), or None when it is clean."""
    return _first(_FREE_TEXT if free_text else _ANY_FIELD, value)


def utf8_fault(value: str, free_text: bool = False) -> str | None:
    """Why ``value`` is not valid UTF-8 (a lone surrogate), or None: the one fault of any field that
    makes its body unreadable rather than unacceptable."""
    return _first(_SURROGATE, value)


def check_text(value: str, field: str, *, free_text: bool = False) -> str:
    """``value`` when it is clean, else ``SpecError`` naming ``field``."""
    fault = text_fault(value, free_text=free_text)
    if fault is not None:
        raise SpecError(field, fault)
    return value


def _shown(key: str) -> str:
    return repr(key if len(key) <= _SHOWN_KEY else f"{key[:_SHOWN_KEY]}...")


def check_strings(
    value: object, path: str = "", *, free_text: Collection[str] = (), fault: Fault = text_fault
) -> None:
    """Check every string in a decoded JSON document, object keys included, before any field is read.

    The refusal names the string's path (``command[2]``, ``env.NCCL_DEBUG``, ``gpu_types[0]``); an
    offending key is named by the object that holds it (``env``; ``body`` at the top). ``free_text``:
    the top-level fields whose string values, at any depth, may hold a tab or a newline (keys never).
    ``fault``: the rule, ``text_fault`` unless a caller looks for one kind of fault only.
    """
    _walk(value, path, free_text, fault, free=False)


def _walk(value: object, path: str, free_text: Collection[str], fault: Fault, *, free: bool) -> None:
    if isinstance(value, str):
        if (why := fault(value, free)) is not None:
            raise SpecError(path or "body", why)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str) and (why := fault(key, False)) is not None:
                raise SpecError(path or "body", f"the key {_shown(key)} {why}")
            inner = f"{path}.{key}" if path else str(key)
            _walk(item, inner, free_text, fault, free=free or (not path and key in free_text))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _walk(item, f"{path}[{index}]", free_text, fault, free=free)
