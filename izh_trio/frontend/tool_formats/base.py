"""What a model family's tool-call syntax is, as the server needs it: a parser of its output
(content, reasoning where the family has it, calls), the grammar of a forced call written in
that syntax, and the look of a call's id (which the family's template may check when the
call comes back in a later turn)."""

from __future__ import annotations

import hashlib
import secrets
import string
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from izh_trio.frontend.chat_parser import Event, ToolCall


class OutputParser(Protocol):
    """The contract of every format's parser: the non-streaming route feeds the whole text,
    the streaming route feeds deltas; both get the same events, whatever the split."""

    calls: list[ToolCall]

    def feed(self, text: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


class JsonCallParser:
    """The streaming frame shared by the JSON-call formats: text is buffered and worked off
    by the format's ``_step`` until it needs more; a JSON decode is only retried once one of
    ``CLOSERS`` has arrived since the last failed one (a value cannot end before)."""

    CLOSERS = "}"

    def __init__(self, call_id: Callable[[], str]) -> None:
        self._buf = ""
        self._call_id = call_id
        self._closed = False  # a closer arrived since the last failed decode
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        self._closed = self._closed or any(c in text for c in self.CLOSERS)
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        return self._drain(final=True)

    def _drain(self, *, final: bool) -> list[Event]:
        out: list[Event] = []
        while self._step(out, final):
            pass
        return [e for e in out if e.text or e.call]

    def _step(self, out: list[Event], final: bool) -> bool:
        """Work off what the buffer allows, adding events to ``out``; False: wait for more."""
        raise NotImplementedError


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
