"""Bounds on a Lark grammar (llguidance's dialect), read without compiling it.

A light scan, not a parser: it skips comments and string literals, checks every
``/regex/`` terminal and every inline ``%json`` schema as a regex and a schema of their
own, counts rule and terminal definitions (a name and a colon at the start of a line),
notes the names each one refers to and at what group depth (to measure how deep the
compiler nests from ``start``: ``schema_refs.rule_depth``), and adds up rule-level
repetitions (``x{n,m}``, ``x~n..m``). A grammar it misreads is still compiled under the
grammar worker's guard; the scan's job is to refuse the grammars that are plainly too
large before that.
"""

from __future__ import annotations

import json
import re

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.grammar_limits import (
    MAX_GRAMMAR_CHARS,
    MAX_GRAMMAR_DEPTH,
    MAX_GRAMMAR_REPEAT,
    MAX_GRAMMAR_RULES,
    Repeats,
    check_regex,
    check_schema,
)
from izh_trio.frontend.schema_refs import rule_depth

_TOKEN = re.compile(r"""
    (?P<rule>^[ \t]*[?!]?(?P<name>[A-Za-z_][\w-]*)(?:\.-?\d+)?[ \t]*(?:\[[^\]\n]*\])?[ \t]*:)
  | (?P<comment>(?://|\#)[^\n]*)
  | (?P<string>"(?:\\.|[^"\\\n])*"i?)
  | (?P<regex>/(?:\\.|[^/\\\n])+/[a-z]*)
  | (?P<directive>%\w+[ \t]*)
  | (?P<count>\{[ \t]*(?P<n>\d*)[ \t]*(?:,[ \t]*(?P<m>\d*)[ \t]*)?\})
  | (?P<tilde>~[ \t]*(?P<lo>\d+)(?:[ \t]*\.\.[ \t]*(?P<hi>\d+))?)
  | (?P<open>[(\[])
  | (?P<close>[)\]])
  | (?P<other>[^"/\#%{~()\[\]\n]+|.)
""", re.VERBOSE | re.MULTILINE | re.DOTALL)

_JSON = json.JSONDecoder()
_NAME = re.compile(r"[A-Za-z_][\w-]*")


def check_lark(grammar: str, param: str) -> None:
    """Raise a 400 naming ``param`` if the grammar is over a bound."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise APIError(400, f"the grammar is too large ({len(grammar)} characters); the limit "
                            f"is {MAX_GRAMMAR_CHARS} characters", param=param)
    rules: dict[str, tuple[int, list[tuple[int, str]]]] = {}
    refs: list[tuple[int, str]] = []  # the current rule's
    name, group, deepest, pos = None, 0, 0, 0
    repeats = Repeats()
    while pos < len(grammar):
        m = _TOKEN.match(grammar, pos)
        assert m is not None  # "other" matches any character
        pos = m.end()
        kind = m.lastgroup
        if kind == "rule":
            if name is not None:
                rules[name] = (deepest + 1, refs)
            name, refs, group, deepest = m["name"], [], 0, 0
            if len(rules) >= MAX_GRAMMAR_RULES:
                raise APIError(400, f"the grammar has more than {MAX_GRAMMAR_RULES} rules and "
                                    f"terminals; the limit is {MAX_GRAMMAR_RULES}", param=param)
        elif kind == "regex":
            body = m["regex"]
            check_regex(body[1:body.rindex("/")], param, "a regex in the grammar")
            repeats.atom()
        elif kind == "directive":
            if m.start() == 0 or grammar[m.start() - 1] == "\n":
                if name is not None:  # %import, %ignore...: the rule before has ended
                    rules[name] = (deepest + 1, refs)
                name, refs = None, []
            if grammar.startswith("{", pos):
                try:  # %json {...}, %llguidance {...}: a JSON value, read whole
                    value, pos = _JSON.raw_decode(grammar, pos)
                except (ValueError, RecursionError):
                    continue  # not JSON: llguidance will say what is wrong
                if m["directive"].startswith("%json"):
                    check_schema(value, param, "a %json schema in the grammar")
            repeats.atom()
        elif kind == "count":
            repeats.count(m["m"] or m["n"] or "0")
        elif kind == "tilde":
            repeats.count(m["hi"] or m["lo"])
        elif kind == "open":
            group += 1
            deepest = max(deepest, group)
            repeats.open()
        elif kind == "close":
            group = max(group - 1, 0)
            repeats.close()
        elif kind in ("string", "other") and not m[0].isspace():
            if kind == "other":
                refs += ((group, ref) for ref in _NAME.findall(m[0]))
            repeats.atom()
    if name is not None:
        rules[name] = (deepest + 1, refs)
    depth = rule_depth(rules)
    if depth > MAX_GRAMMAR_DEPTH:
        raise APIError(400, f"the grammar nests {depth} levels deep from its start rule (each "
                            "rule nesting the rules it refers to, each group one more); the "
                            f"limit is {MAX_GRAMMAR_DEPTH} levels", param=param)
    cost = repeats.cost()
    if cost > MAX_GRAMMAR_REPEAT:
        raise APIError(400, f"the grammar repeats too much: its counted repetitions "
                            f"(x{{n,m}}, x~n..m) come to {cost}; the limit is "
                            f"{MAX_GRAMMAR_REPEAT} (nested counts multiply, sequences add)",
                       param=param)
