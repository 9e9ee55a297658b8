"""The shortest text that completes a JSON prefix: how a guided JSON output ends in budget.

Guided decoding guarantees that a finished output matches its grammar, not that it finishes:
a free-form string can run past ``max_tokens``. In the last tokens of a JSON-constrained
request the engine therefore steers, within the grammar's mask, along this completion.
Works on compact JSON (what our grammars produce); returns None for what it can't read.
"""

from __future__ import annotations

_LITERALS = ("true", "false", "null")


def json_completion(prefix: str) -> str | None:
    """Text that, appended to ``prefix``, makes one complete JSON value (or None)."""
    stack: list[str] = []  # "{" or "["
    # what the innermost container expects next: key | colon | value | comma
    expect = "value"
    i, n = 0, len(prefix)
    while i < n:
        c = prefix[i]
        if c == '"':
            end, escaped = i + 1, False
            while end < n and (escaped or prefix[end] != '"'):
                escaped = not escaped and prefix[end] == "\\"
                end += 1
            if end == n:  # inside a string: close it (finishing an escape first)
                tail = ("n" if escaped else "") + _unicode_escape_rest(prefix[i + 1 :]) + '"'
                if expect == "key":
                    return tail + ":null" + _closers(stack)
                return tail + _closers(stack)
            expect = "colon" if expect == "key" else "comma"
            i = end + 1
            continue
        if c in " \t\r\n":
            i += 1
        elif c == "{":
            stack.append("{")
            expect = "key"
            i += 1
        elif c == "[":
            stack.append("[")
            expect = "value"
            i += 1
        elif c in "}]":
            if not stack:
                return None
            stack.pop()
            expect = "comma"
            i += 1
        elif c == ":":
            expect = "value"
            i += 1
        elif c == ",":
            expect = "key" if stack and stack[-1] == "{" else "value"
            i += 1
        elif c in "-0123456789":
            j = i + 1
            while j < n and prefix[j] in "0123456789.eE+-":
                j += 1
            if j == n:  # a number still being written
                fix = "0" if prefix[j - 1] in "-.eE+" else ""
                return fix + _closers(stack)
            expect = "comma"
            i = j
        elif c.isalpha():
            j = i
            while j < n and prefix[j].isalpha():
                j += 1
            word = prefix[i:j]
            if j == n:
                lit = next((w for w in _LITERALS if w.startswith(word)), None)
                return None if lit is None else lit[len(word):] + _closers(stack)
            if word not in _LITERALS:
                return None
            expect = "comma"
            i = j
        else:
            return None
    if not stack and expect == "comma":
        return ""  # already complete
    if expect == "key":
        # "{" or "{...," : an empty object closes at once; after a comma a member must follow
        opened_empty = prefix.rstrip().endswith("{")
        return ("" if opened_empty else '"":null') + _closers(stack)
    if expect == "colon":
        return ":null" + _closers(stack)
    if expect == "value":
        if stack and stack[-1] == "[" and prefix.rstrip().endswith("["):
            return _closers(stack)
        return "null" + _closers(stack)
    return _closers(stack)


def _closers(stack: list[str]) -> str:
    return "".join("}" if s == "{" else "]" for s in reversed(stack))


def _unicode_escape_rest(body: str) -> str:
    """Hex digits that finish a ``\\uXXXX`` escape cut short at the end of a string body."""
    head, sep, tail = body.rpartition("\\u")
    if not sep or len(tail) >= 4 or any(c not in "0123456789abcdefABCDEF" for c in tail):
        return ""
    backslashes = len(head) - len(head.rstrip("\\"))
    return "0" * (4 - len(tail)) if backslashes % 2 == 0 else ""
