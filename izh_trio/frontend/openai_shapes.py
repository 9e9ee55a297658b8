"""OpenAI's answer shapes: usage, logprobs in either API's form, and the envelope that chat and
completions answers share (:class:`OpenAIOutput`)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer

from izh_trio.frontend import sse
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import ChoiceDelta, ChoiceSpec
from izh_trio.frontend.schemas import StreamOptions
from izh_trio.frontend.serving.api import Head, Tally
from izh_trio.wire import TokenLogprobs

#: JSON has no -inf; like vLLM, report impossible tokens with a very low finite logprob.
_FLOOR = -9999.0


def usage(tally: Tally) -> dict[str, Any]:
    prompt, completion = tally.prompt_tokens, tally.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": tally.cached_tokens}}


class OpenAIOutput(abc.ABC):
    """What every chat and completions answer has around its choices: the head (id, object,
    created, model, system_fingerprint) on the body and on every chunk; usage, in the body,
    and in a stream as ``stream_options`` ask (on every chunk, or null there and the totals
    in a last chunk); an error inside a stream as an event of the error body; ``data:
    [DONE]`` last. A subclass folds the deltas into its choices and says them."""

    def __init__(self, head: Head, specs: Sequence[ChoiceSpec], options: StreamOptions | None,
                 *, kind: str, chunk_kind: str) -> None:
        self.tally = Tally(specs)
        self._head = _fields(head, kind)
        self._chunk_head = _fields(head, chunk_kind)
        self._continuous = bool(options and options.continuous_usage_stats)
        self._include_usage = bool(options and options.include_usage)

    @abc.abstractmethod
    def add(self, delta: ChoiceDelta) -> None: ...

    @abc.abstractmethod
    def choices(self) -> list[dict[str, Any]]:
        """The choices of a non-streamed answer, every delta added."""

    @abc.abstractmethod
    def stream(self, delta: ChoiceDelta, events: list[bytes]) -> None: ...

    def body(self) -> dict[str, Any]:
        return {**self._head, "choices": self.choices(), "usage": usage(self.tally)}

    def chunk(self, choice: dict[str, Any]) -> bytes:
        """One choice's streamed chunk, as an event."""
        body = {**self._chunk_head, "choices": [choice]}
        if self._continuous:
            body["usage"] = usage(self.tally)
        elif self._include_usage:
            body["usage"] = None  # as OpenAI: the totals come in a last chunk
        return sse.event(body)

    def opening(self, events: list[bytes]) -> None:
        """Nothing: an OpenAI stream begins with its first choice's chunk."""
        return

    def closing(self, events: list[bytes]) -> None:
        if self._include_usage:
            events.append(sse.event({**self._chunk_head, "choices": [],
                                     "usage": usage(self.tally)}))
        events.append(sse.DONE)

    def failing(self, error: APIError, events: list[bytes]) -> None:
        events.append(sse.event(error.body()))
        events.append(sse.DONE)


def _fields(head: Head, kind: str) -> dict[str, Any]:
    return {"id": head.id, "object": kind, "created": head.created, "model": head.model,
            "system_fingerprint": head.fingerprint}


class TokenText:
    """Token ids as the text clients see in logprobs, decoded one id at a time (cached)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._tokenizer.decode([token_id],
                                                                  skip_special_tokens=False)
        return text


def _lp(value: float) -> float:
    return max(value, _FLOOR)


def completion_logprobs(
    text_of: TokenText, entries: Sequence[TokenLogprobs | None], first_offset: int,
    token_ids: list[int],
) -> dict[str, Any]:
    """OpenAI's legacy shape; ``None`` entries (the first prompt token) get null values."""
    tokens, offsets = [], []
    lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offset = first_offset
    for token_id, entry in zip(token_ids, entries, strict=True):
        text = text_of(token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            lps.append(None)
            tops.append(None)
            continue
        lps.append(_lp(entry.logprob))
        top = {text_of(t): _lp(lp) for t, lp in zip(entry.top_ids, entry.top_logprobs,
                                                     strict=True)}
        top.setdefault(text, _lp(entry.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
            "text_offset": offsets}


def chat_logprobs(text_of: TokenText, entries: Sequence[TokenLogprobs]
                  ) -> list[dict[str, Any]]:
    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = text_of(token_id)
        return {"token": text, "logprob": _lp(logprob), "bytes": list(text.encode())}

    return [{**item(e.token_id, e.logprob),
             "top_logprobs": [item(t, lp) for t, lp in zip(e.top_ids, e.top_logprobs,
                                                             strict=True)]}
            for e in entries]
