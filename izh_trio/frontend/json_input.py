"""JSON from clients: parsed strictly, so that what passes is plain, finite, shallow text.

Every request body, and every JSON document a client sends inside one (tool-call arguments,
a JSON schema given as a string), is parsed here, by orjson, which refuses on its own what
would otherwise fail far from the parser, as a 500:

* lone UTF-16 surrogates (``"\\ud800"``): Python would carry them in a ``str`` until the
  tokenizer, a regex compiler or an encoder raised on them;
* numbers a double cannot hold: an integer of thousands of digits is a ``ValueError``
  (Python's int-to-str limit) in the standard library;
* ``NaN`` and ``Infinity``, which are not JSON: no field accepts them, and a schema
  carrying one could not be written back as JSON;
* invalid UTF-8 and a byte-order mark (RFC 8259: UTF-8, no BOM).

orjson allows 1,024 levels of nesting; this module allows :data:`MAX_DEPTH`, since Python
code that walks or re-encodes a value recursively (the template's ``tojson``, cattrs, schema
checks) must stay far from the interpreter's recursion limit. Integers of 64 bits or more
become floats in orjson, as in most JSON parsers; every integer field is a 64-bit one, so such
a value is refused by the field's own type check either way.

A failure is a :class:`JSONInputError` naming the problem and, where it is cheap to know, the
top-level field that holds it (the route's 400 puts it in ``param``).
"""

from __future__ import annotations

import json
import re
from itertools import chain, compress, repeat
from operator import is_
from typing import Any

import orjson

#: Arrays and objects nested deeper than this are refused (a request nests a handful).
MAX_DEPTH = 128

# orjson's messages for the classes above, reworded for a client (the position is added).
_REWORDED = (
    ("not valid UTF-8", "the body is not valid UTF-8"),  # orjson adds "surrogates not allowed"
    ("surrogate", "a string holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without "
                  "its pair), which is not Unicode text"),
    ("number is infinity", "a number is too large (beyond a 64-bit float)"),
    ("depth limit", f"arrays and objects are nested more than {MAX_DEPTH} deep"),
    ("byte order mark", "the body starts with a byte-order mark, which JSON does not allow"),
)
#: The field of a parse error is looked for in documents up to this size only: finding it
#: re-reads the members before it, which for a body of many megabytes would hold up the
#: event loop longer than a courtesy is worth.
FIELD_SEARCH_LIMIT = 1 << 20
_NON_FINITE = re.compile(r"-?(?:NaN|Infinity)")
_WHITESPACE = re.compile(r"[ \t\n\r]*")


class JSONInputError(ValueError):
    """Why a client's JSON was refused, and the top-level field it is in (None: unknown)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def loads(data: bytes | str) -> Any:
    """Parse a client's JSON document strictly (see the module's notes), or raise
    :class:`JSONInputError`."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _refusal(data, exc) from None
    _check_depth(value, data)
    return value


def _refusal(data: bytes | str, exc: orjson.JSONDecodeError) -> JSONInputError:
    text, pos = _text_and_position(data, exc.pos)
    if _NON_FINITE.match(text, pos):
        problem = "NaN and Infinity are not JSON numbers"
    else:
        problem = next((why for key, why in _REWORDED if key in exc.msg), exc.msg)
    line = text.count("\n", 0, pos) + 1
    column = pos - text.rfind("\n", 0, pos)
    field = _top_level_field(text, pos) if len(text) <= FIELD_SEARCH_LIMIT else None
    return JSONInputError(f"{problem} (line {line}, column {column})", field)


def _text_and_position(data: bytes | str, pos: int) -> tuple[str, int]:
    """The document as text and the error's position in it: orjson counts characters, and
    reports invalid UTF-8 at position 0, so that one is found here (in characters too)."""
    if isinstance(data, str):
        return data, pos
    try:
        return data.decode("utf-8"), pos
    except UnicodeDecodeError as bad:
        return (data.decode("utf-8", "replace"),
                len(data[:bad.start].decode("utf-8", "replace")))


def _skip_space(text: str, i: int) -> int:
    """``i`` moved past any JSON whitespace there."""
    space = _WHITESPACE.match(text, i)
    return space.end() if space else i  # the pattern matches the empty string: always one


def _top_level_field(text: str, pos: int) -> str | None:
    """The key of the top-level member whose text holds ``pos`` (None: not an object, or
    ``pos`` is outside every member's value). Only on the error path: the standard
    library's lenient decoder measures each member's value (it accepts what orjson refused,
    and is told to keep numbers as text, so that nothing here can raise on size)."""
    decoder = json.JSONDecoder(parse_int=str, parse_float=str, parse_constant=str,
                               strict=False)
    i = _skip_space(text, 0)
    if not text.startswith("{", i):
        return None
    i += 1
    while True:
        i = _skip_space(text, i)
        if not text.startswith('"', i):
            return None
        key: str  # a JSON string, as the text at i is one
        try:
            key, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        if pos < i:  # the key itself is the problem (a surrogate in it is shown escaped)
            return key.encode("utf-8", "backslashreplace").decode("utf-8")
        i = _skip_space(text, i)
        if not text.startswith(":", i):
            return None
        start = _skip_space(text, i + 1)
        try:
            _, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):  # this value is where parsing broke
            return key if pos >= start else None
        if pos < end:
            return key
        i = _skip_space(text, end)
        if not text.startswith(",", i):
            return None
        i += 1


_CONTAINERS = frozenset((dict, list))


def _check_depth(value: Any, data: bytes | str) -> None:
    """Refuse ``value`` if it nests deeper than :data:`MAX_DEPTH`, naming the top-level
    member that does.

    A document with fewer brackets than the limit cannot nest deeper, and counting them is
    a C-speed scan, so most bodies are never walked; a body of megabytes is walked at once
    (its walk costs by the value, and one of a few huge strings has few, where two scans
    would cost the event loop for nothing). The walk goes a level at a time with itertools
    and ``map`` only, so that no Python bytecode runs per value and a body of millions of
    small arrays costs a fraction of its parse (``tools/bench/results/frontend.md``). No
    recursion either, so no depth can exhaust the stack."""
    if len(data) <= FIELD_SEARCH_LIMIT:
        if isinstance(data, bytes):
            brackets = data.count(b"[") + data.count(b"{")
        else:
            brackets = data.count("[") + data.count("{")
        if brackets <= MAX_DEPTH:
            return
    if type(value) is dict:  # the members one by one, to name the one that is too deep
        for key, member in value.items():
            if _deeper_than(member, MAX_DEPTH - 1):
                raise JSONInputError(f"arrays and objects are nested more than {MAX_DEPTH} "
                                     "deep", key)
    elif _deeper_than(value, MAX_DEPTH):
        raise JSONInputError(f"arrays and objects are nested more than {MAX_DEPTH} deep")


def _deeper_than(root: Any, limit: int) -> bool:
    """Whether ``root`` nests arrays and objects more than ``limit`` deep."""
    level = [root] if type(root) in _CONTAINERS else []
    for _ in range(limit):
        if not level:
            return False
        lists = compress(level, map(is_, map(type, level), repeat(list)))
        dicts = compress(level, map(is_, map(type, level), repeat(dict)))
        children = [*chain.from_iterable(lists), *chain.from_iterable(map(dict.values, dicts))]
        level = [*compress(children, map(_CONTAINERS.__contains__, map(type, children)))]
    return bool(level)
