"""How deep a compiler recurses into a JSON schema or a Lark grammar, references followed.

llguidance compiles a schema depth-first, in document order, and expands each ``$ref``
target once: the first reference to a definition compiles it where it stands, nested in
whatever led there; later ones (recursion included) refer to the compiled rule. A Lark
grammar's rules are compiled the same way from ``start``. So a chain of definitions, each
referring to the next, nests as deep as it is long, whatever order they are written in,
and a recursive definition (a tree, an AST) nests only once. These walks do the same,
without recursion, and return the deepest nesting reached: every object or array level
(every parenthesised group, in Lark) counts one, and a reference continues one below
where it stands, which is what makes the count comparable with the stack a compile has
(the depths that overflowed it: ``tools/bench/results/frontend.md``).

Only local references (``#``, ``#/json/pointer``) are followed; others (URLs, anchors) are
leaves: the compiler refuses or resolves them without nesting further here.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

#: Keywords whose values are data, not schemas: no "$ref" or "pattern" inside them counts.
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
#: Keywords whose values map names to schemas: a property may be called "enum" or "$ref".
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                         "dependentSchemas"})
#: Keywords whose values hold definitions, compiled only where something refers to them.
_DEFINITIONS = frozenset({"$defs", "definitions"})


def children(node: Any, names: bool, skip: frozenset[str] = DATA_KEYWORDS
             ) -> list[tuple[Any, bool]]:
    """The objects and arrays in ``node`` that hold schemas, each with whether it is a map
    of names to schemas. ``names``: ``node`` is such a map (its keys are no keywords)."""
    if isinstance(node, list):
        return [(v, False) for v in node if isinstance(v, dict | list)]
    if names:
        return [(v, False) for v in node.values() if isinstance(v, dict | list)]
    return [(v, k in SCHEMA_MAPS and isinstance(v, dict)) for k, v in node.items()
            if k not in skip and isinstance(v, dict | list)]


def ref_of(node: Any, names: bool) -> str | None:
    """The reference a schema object makes, if it is one and makes one."""
    if names or not isinstance(node, dict):
        return None
    ref = node.get("$ref")
    return ref if isinstance(ref, str) else None


def resolve(schema: Any, ref: str) -> Any:
    """The object or array a local reference points at, or None."""
    if not ref.startswith("#"):
        return None
    pointer = unquote(ref[1:])
    if not pointer:
        return schema
    if not pointer.startswith("/"):
        return None  # an anchor
    node = schema
    for part in pointer[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, dict | list) else None


def schema_depth(schema: Any) -> int:
    """The deepest nesting a compiler reaches in ``schema``, its references followed."""
    targets = {id(schema)}
    stack = [(schema, False)]
    while stack:  # first, every node a reference points at: each is expanded once
        node, names = stack.pop()
        if (ref := ref_of(node, names)) is not None \
                and (target := resolve(schema, ref)) is not None:
            targets.add(id(target))
        stack += children(node, names)
    skip = DATA_KEYWORDS | _DEFINITIONS  # definitions nest where they are referred to
    expanded: set[int] = set()
    deepest = 0
    walk: list[tuple[Any, bool, int]] = [(schema, False, 1)]
    while walk:
        node, names, depth = walk.pop()
        if id(node) in targets and not names:
            if id(node) in expanded:
                continue
            expanded.add(id(node))
        deepest = max(deepest, depth)
        kids = [(v, map_, depth + 1) for v, map_ in children(node, names, skip)]
        if (ref := ref_of(node, names)) is not None \
                and (target := resolve(schema, ref)) is not None:
            kids.insert(0, (target, False, depth + 1))
        walk.extend(reversed(kids))  # popped in document order: depth-first, as compiled
    return deepest


def rule_depth(rules: dict[str, tuple[int, list[tuple[int, str]]]], start: str = "start"
               ) -> int:
    """The deepest nesting a compiler reaches from ``start``: ``rules`` maps a rule's name
    to (its deepest group nesting + 1, the (group depth, name) of each reference in it, in
    order)."""
    if start not in rules:
        return 0
    expanded = {start}
    deepest = 0
    frames = [(start, 0, 0)]  # (rule, depth it stands at, next reference to follow)
    while frames:
        name, base, i = frames.pop()
        own, refs = rules[name]
        deepest = max(deepest, base + own)
        while i < len(refs):
            depth, ref = refs[i]
            i += 1
            if ref in rules and ref not in expanded:
                expanded.add(ref)
                frames.append((name, base, i))  # resumed once ``ref`` is done
                frames.append((ref, base + depth + 1, 0))
                break
    return deepest
