"""What a model family's tool-call syntax is, as the server needs it: a parser of its output
(content, reasoning where the family has it, calls), the grammar of a forced call written in
that syntax, and the look of a call's id (which the family's template may check when the
call comes back in a later turn)."""

from __future__ import annotations

import hashlib
import json
import secrets
import string
from typing import Any, Protocol

import attrs

from izh_trio.frontend.chat_parser import Event, ToolCall


class OutputParser(Protocol):
    """The contract of every format's parser: the non-streaming route feeds the whole text,
    the streaming route feeds deltas; both get the same events, whatever the split."""

    calls: list[ToolCall]

    def feed(self, text: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


def openai_call_id() -> str:
    """OpenAI's shape of a call id (``call_`` and 24 hex digits)."""
    return f"call_{secrets.token_hex(12)}"


_ALNUM = string.ascii_letters + string.digits


def alnum_call_id() -> str:
    """Mistral's: 9 characters of ``[A-Za-z0-9]``, which its template insists on."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def alnum_id_of(call_id: str) -> str:
    """``call_id`` if it is 9 alphanumerics, else 9 derived from it (the same every time,
    so that a call and its result keep matching, and distinct ids stay distinct)."""
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    number = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    digits = []
    for _ in range(9):
        number, digit = divmod(number, len(_ALNUM))
        digits.append(_ALNUM[digit])
    return "".join(digits)


def call_from_json(obj: Any, call_id: str) -> ToolCall | None:
    """A call from ``{"name": .., "arguments" | "parameters": {..}}``, or None when the
    object is no call (arguments already JSON-encoded as a string are accepted)."""
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str) and obj["name"]):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(id=call_id, name=obj["name"], arguments=json.dumps(args, ensure_ascii=False))


@attrs.frozen
class ToolFormat:
    """A family's tool-call syntax. Subclasses give the parser and the forced-call grammar."""

    #: The ``--tool-call-parser`` name.
    name: str = "hermes"
    #: Whether the family thinks in ``<think>`` .. ``</think>`` before it answers.
    reasoning: bool = False
    #: Whether several forced calls may follow one another (the template can say them back).
    parallel_calls: bool = True

    @property
    def markers(self) -> tuple[str, ...]:
        """Texts the parser reads: decoded even where the checkpoint makes them special."""
        return ()

    def parser(self, *, tools: bool) -> OutputParser:
        raise NotImplementedError

    def grammar(self, tools: list[dict[str, Any]], *, only: str | None, parallel: bool,
                or_json: dict[str, Any] | bool | None = None, param: str = "tools") -> str:
        raise NotImplementedError

    def call_id(self) -> str:
        return openai_call_id()

    def history_id(self, call_id: str) -> str:
        """The id the template is shown for a call id a client sends back (its own, or one
        another API wrapped, as the Messages API's ``toolu_``)."""
        return call_id
