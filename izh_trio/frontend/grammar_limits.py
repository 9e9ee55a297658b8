"""Bounds on output constraints, checked in pure Python before any grammar library sees them.

llguidance compiles a grammar by recursion on the native stack: a schema whose ``$ref``s chain a
few thousand deep, or a Lark grammar of a few thousand chained rules, overflows it and kills the
process with SIGSEGV. Repetition counts cost time and memory instead: a huge one compiles, then
errors mid-generation. Each bound below is a 400 that names the field and the limit. They are
set well above what real clients send (OpenAI's own limits for structured outputs are 5,000
properties, 10 levels of nesting, 1,000 enum values) and well below what breaks the library (the
measured margins: ``tools/bench/results/frontend.md``):

* ``MAX_SCHEMA_CHARS`` (256 Ki): a schema's compact JSON, a few times a big tool list's.
* ``MAX_SCHEMA_DEPTH`` (64): the schema document's own nesting (objects and arrays). OpenAI
  allows 10 levels of objects (about 20 here); llguidance itself refuses deeper ones.
* ``MAX_SCHEMA_PROPERTIES`` (2,000): properties declared in a schema (all tools together).
  Compile time grows faster than their number, and the engine compiles each grammar again
  on its own loop; OpenAI allows 5,000, pydantic models a few hundred.
* ``MAX_SCHEMA_REFS`` (1,000): ``$ref``s in one schema (all tools together): a model with a
  few hundred fields of nested-model types has a few hundred.
* ``MAX_REF_DEPTH`` (256): how deep the schema nests with its references followed, which is
  how deep llguidance recurses (``schema_refs``): each object or array level counts one,
  and the first reference to a definition nests it where it stands (a chain of 5,000
  definitions, each referring to the next, is 5,000 deep; a recursive tree stays shallow).
  256 levels take a quarter of the stack the grammar worker compiles on and an eighth of
  the engine's 8 MiB; pydantic's models, nested or recursive, come to far less.
* ``MAX_GUIDED_CHOICES`` (4,096) strings of at most ``MAX_CHOICES_CHARS`` (256 Ki) in all:
  the choices become one terminal of the grammar, cheap to compile; labels and entity
  lists are far smaller, and a list of 100,000 is refused before it is read.
* ``MAX_GRAMMAR_CHARS`` (256 Ki), ``MAX_GRAMMAR_RULES`` (512) and ``MAX_GRAMMAR_DEPTH`` (256)
  for Lark: real grammars (SQL, a Python subset) have a few hundred rules at most and nest
  well under 256 deep from ``start`` (a rule that refers to another nests it; a group nests
  one more), which stays far from a 4 MiB stack's end.
* ``MAX_REGEX_CHARS`` (16 Ki) and ``MAX_REGEX_REPEAT`` (10,000): a regex's counted
  repetitions (``{n}``, ``{n,m}``, ``{n,}``), nested ones multiplied, one after another
  added. Masking slows with the count, and a count of a million fails mid-generation.
  Applies to ``guided_regex``, a schema's ``pattern``/``patternProperties`` and a Lark
  grammar's ``/regex/`` terminals.
* ``MAX_GRAMMAR_REPEAT`` (1,000): a Lark grammar's rule-level repetitions (``x{n,m}``,
  ``x~n..m``), added up: a group of 7 symbols repeated 10,000 times exhausts the parser's
  50,000 items mid-generation.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.schema_refs import DATA_KEYWORDS, SCHEMA_MAPS, schema_depth

MAX_SCHEMA_CHARS = 256 * 1024
MAX_SCHEMA_DEPTH = 64
MAX_SCHEMA_PROPERTIES = 2_000
MAX_SCHEMA_REFS = 1_000
MAX_REF_DEPTH = 256
MAX_GUIDED_CHOICES = 4_096
MAX_CHOICES_CHARS = 256 * 1024
MAX_GRAMMAR_CHARS = 256 * 1024
MAX_GRAMMAR_RULES = 512
MAX_GRAMMAR_DEPTH = 256
MAX_REGEX_CHARS = 16 * 1024
MAX_REGEX_REPEAT = 10_000
MAX_GRAMMAR_REPEAT = 1_000


def _too(param: str, what: str, limit: str) -> APIError:
    return APIError(400, f"{what}; the limit is {limit}", param=param)


@attrs.frozen
class SchemaSize:
    """What a schema adds to a grammar's bounded totals (approximate)."""

    chars: int
    refs: int
    properties: int


def check_schema(schema: Any, param: str, what: str = "the JSON schema") -> SchemaSize:
    """Raise a 400 naming ``param`` if ``schema`` is over a bound; else its size, for totals
    over several schemas compiled as one grammar.

    One walk, without recursion (a body may nest far deeper than Python recurses), that
    stops as soon as a bound is passed: a huge schema costs no more than a legal one."""
    if not isinstance(schema, dict | list):
        return SchemaSize(_scalar_size(schema), 0, 0)
    # A container is counted when it is found (its brackets and one character an item, at
    # least), so a list of a million small lists ends the walk before it is read.
    size, refs, properties = 1 + len(schema), 0, 0
    # (node, its depth, whether it is data, whether it maps names to schemas)
    stack: list[tuple[Any, int, bool, bool]] = [(schema, 1, False, False)]
    while stack:
        node, depth, data, names = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise _too(param, f"{what} nests deeper than {MAX_SCHEMA_DEPTH} levels",
                       f"{MAX_SCHEMA_DEPTH} levels of objects and arrays")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            keyword = isinstance(key, str) and not names and not data
            if isinstance(key, str):
                size += len(key) + 4
                if keyword:
                    if key == "$ref" and isinstance(value, str):
                        refs += 1
                    elif key == "properties" and isinstance(value, dict):
                        properties += len(value)
                    elif key == "pattern" and isinstance(value, str):
                        check_regex(value, param, f"a pattern in {what}")
                    elif key == "patternProperties" and isinstance(value, dict):
                        for rx in value:
                            check_regex(rx, param, f"a patternProperties key in {what}")
            if isinstance(value, dict | list):
                stack.append((value, depth + 1, data or (keyword and key in DATA_KEYWORDS),
                               keyword and key in SCHEMA_MAPS and isinstance(value, dict)))
                size += 1 + len(value)
            else:
                size += _scalar_size(value)
            if size > MAX_SCHEMA_CHARS:
                raise _too(param, f"{what} is too large (over {MAX_SCHEMA_CHARS} characters "
                                  "as JSON)", f"{MAX_SCHEMA_CHARS} characters")
    _check_counts(SchemaSize(size, refs, properties), param, what, "has")
    if refs and (deep := schema_depth(schema)) > MAX_REF_DEPTH:
        raise _too(param, f"{what} nests {deep} levels deep with its $refs followed",
                   f"{MAX_REF_DEPTH} levels (a $ref chain nests as deep as it is long)")
    return SchemaSize(size, refs, properties)


def _check_counts(size: SchemaSize, param: str, what: str, has: str) -> None:
    if size.chars > MAX_SCHEMA_CHARS:
        raise _too(param, f"{what} {'are' if has == 'have' else 'is'} too large "
                          f"({size.chars} characters as JSON)", f"{MAX_SCHEMA_CHARS} characters")
    if size.properties > MAX_SCHEMA_PROPERTIES:
        raise _too(param, f"{what} {has} {size.properties} properties",
                   f"{MAX_SCHEMA_PROPERTIES} properties")
    if size.refs > MAX_SCHEMA_REFS:
        raise _too(param, f"{what} {has} {size.refs} $refs", f"{MAX_SCHEMA_REFS} $refs")


def check_schema_totals(sizes: list[SchemaSize], param: str, what: str) -> None:
    """Bounds on several schemas compiled as one grammar (a request's tools)."""
    total = SchemaSize(sum(s.chars for s in sizes), sum(s.refs for s in sizes),
                       sum(s.properties for s in sizes))
    _check_counts(total, param, f"{what} together", "have")


def _scalar_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() // 3 + 2  # a decimal digit is ~3.3 bits; no str() needed
    return 8


def check_choices(choices: list[Any], param: str) -> None:
    if len(choices) > MAX_GUIDED_CHOICES:
        raise _too(param, f"{len(choices)} choices are too many",
                   f"{MAX_GUIDED_CHOICES} choices")
    total = sum(len(c) for c in choices if isinstance(c, str))
    if total > MAX_CHOICES_CHARS:
        raise _too(param, f"the choices are too long together ({total} characters)",
                   f"{MAX_CHOICES_CHARS} characters")


# ---------------------------------------------------------------- regexes

#: One regex token: an escape (``\p{..}``, ``\x{..}`` with their braces), a character class
#: (nested ones included), a group's start or end, a counted repetition, any other char.
_RX_TOKEN = re.compile(r"""
    (?P<esc>\\(?:[pPxuUN]\{[^}]*\}|.))
  | (?P<cls>\[\^?\]?(?:\\.|\[:\w+:\]|\[[^\]]*\]|[^\]\\])*\])
  | (?P<open>\()
  | (?P<close>\))
  | (?P<count>\{(?P<n>\d+)(?:,(?P<m>\d*))?\})
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)


class Repeats:
    """Counted repetitions, nested counts multiplied, sequences added (what llguidance
    unrolls): ``a{3}b{2}`` is 5, ``(a{100}){100}`` 10,000. ``*``, ``+`` and ``?`` cost
    nothing: they stay loops. Fed one token at a time by a scanner."""

    def __init__(self) -> None:
        self.total = 0  # the sequence read so far, in the innermost open group
        self._groups: list[int] = []  # the total before each open group
        self._last = 0  # the cost of the last atom (a group's content), already in total

    def open(self) -> None:
        self._groups.append(self.total)
        self.total = self._last = 0

    def close(self) -> None:
        self._last = self.total
        self.total = (self._groups.pop() if self._groups else 0) + self._last

    def count(self, digits: str) -> None:
        count = max(int(digits) if len(digits) < 10 else 10**10, 1)
        self.total += count * max(self._last, 1) - self._last  # the atom, count times over
        self._last = count * max(self._last, 1)

    def atom(self) -> None:
        self._last = 0

    def cost(self) -> int:
        return self.total + sum(self._groups)  # an unclosed group is an error anyway


def repeat_cost(regex: str) -> int:
    """``regex``'s counted repetitions (see :class:`Repeats`)."""
    repeats = Repeats()
    for m in _RX_TOKEN.finditer(regex):
        kind = m.lastgroup
        if kind == "open":
            repeats.open()
        elif kind == "close":
            repeats.close()
        elif kind == "count":
            repeats.count(m["m"] or m["n"])
        else:
            repeats.atom()
    return repeats.cost()


def check_regex(regex: str, param: str, what: str = "the regex") -> None:
    if len(regex) > MAX_REGEX_CHARS:
        raise _too(param, f"{what} is too long ({len(regex)} characters)",
                   f"{MAX_REGEX_CHARS} characters")
    cost = repeat_cost(regex)
    if cost > MAX_REGEX_REPEAT:
        raise _too(param, f"{what} repeats too much: its counted repetitions ({{n}}, "
                          f"{{n,m}}) come to {cost}",
                   f"{MAX_REGEX_REPEAT} (nested counts multiply, sequences add)")
