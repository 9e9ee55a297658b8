"""A completion's answer: each choice's text (with the prompt's, for ``echo``) and OpenAI's
legacy logprobs, said as a ``text_completion`` or as its chunks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from izh_trio.frontend.generation import ChoiceDelta, ChoiceSpec
from izh_trio.frontend.openai_shapes import OpenAIOutput, TokenText, completion_logprobs
from izh_trio.frontend.schemas import CompletionRequest
from izh_trio.frontend.serving.api import Head
from izh_trio.wire import TokenLogprobs


@attrs.define
class Prompt:
    ids: list[int]
    text: str  # "" for an id prompt unless echo shows it


@attrs.define
class CompletionChoice:
    """One choice as it accumulates (non-streaming) or streams (text so far, for offsets)."""

    prompt: Prompt
    parts: list[str] = attrs.Factory(list)  # the text so far, joined once at the end
    text_len: int = 0
    token_ids: list[int] = attrs.Factory(list)
    logprob_entries: list[TokenLogprobs | None] = attrs.Factory(list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class CompletionOutput(OpenAIOutput):
    def __init__(self, head: Head, specs: Sequence[ChoiceSpec], prompts: Sequence[Prompt],
                 req: CompletionRequest, text_of: TokenText) -> None:
        super().__init__(head, specs, req.stream_options, kind="text_completion",
                         chunk_kind="text_completion")
        self._choices = [CompletionChoice(prompts[s.prompt_index]) for s in specs]
        self._echo = req.echo
        self._logprobs = req.logprobs is not None
        self._text_of = text_of

    def add(self, delta: ChoiceDelta) -> None:
        self._apply(self._choices[delta.index], delta)

    def choices(self) -> list[dict[str, Any]]:
        return [self._choice(i, out, "".join(out.parts)) for i, out in enumerate(self._choices)]

    def stream(self, delta: ChoiceDelta, events: list[bytes]) -> None:
        out = self._choices[delta.index]
        offset, since = out.text_len, len(out.token_ids)
        text = self._apply(out, delta)
        if not text and delta.finish_reason is None and not self._logprobs:
            return  # held back (a possible stop string) or half a character
        events.append(self.chunk(self._choice(delta.index, out, text, offset=offset,
                                              since=since)))

    def _apply(self, out: CompletionChoice, d: ChoiceDelta) -> str:
        """Fold a delta into the choice; return the text this delta adds (echo included)."""
        text = d.text
        if d.first and self._echo:
            text = out.prompt.text + text
            if self._logprobs:
                out.token_ids += out.prompt.ids
                # A deadline that passed before the engine scored the prompt leaves its
                # logprobs unknown: null, as the first token's, one entry per token still.
                scored: Sequence[TokenLogprobs | None] | None = d.prompt_logprobs
                if scored is None:
                    scored = (None,) * (len(out.prompt.ids) - 1)
                out.logprob_entries += [None, *scored]
        out.parts.append(text)
        out.text_len += len(text)
        out.token_ids += d.token_ids
        if self._logprobs:
            out.logprob_entries += d.logprobs or []
        out.finish_reason, out.stop_reason = d.finish_reason, d.stop_reason
        self.tally.add(d)
        return text

    def _choice(self, index: int, out: CompletionChoice, text: str, *, offset: int = 0,
                since: int = 0) -> dict[str, Any]:
        logprobs = None
        if self._logprobs:
            logprobs = completion_logprobs(self._text_of, out.logprob_entries[since:], offset,
                                           out.token_ids[since:])
        return {"index": index, "text": text, "logprobs": logprobs,
                "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
