"""What the generation APIs make of a generation's deltas, in the frontend alone."""

from __future__ import annotations

import json
from typing import Any

import pytest

from izh_trio.frontend.chat_output import ChatOutput
from izh_trio.frontend.chat_tools import plan_tools
from izh_trio.frontend.completion_output import CompletionOutput, Prompt
from izh_trio.frontend.generation import ChoiceDelta, ChoiceSpec
from izh_trio.frontend.openai_shapes import TokenText
from izh_trio.frontend.schemas import ChatCompletionRequest, CompletionRequest, parse_body
from izh_trio.frontend.serving.api import Head, Output
from izh_trio.frontend.serving.pipeline import _events
from izh_trio.wire import SamplingParams


class _Letters:
    """A tokenizer stand-in: token id i is the letter chr(97 + i)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(97 + i) for i in ids)


TEXT_OF = TokenText(_Letters())  # type: ignore[arg-type]
HEAD = Head("x", 0, "m", "fp_0")


def _specs(prompt: list[int]) -> list[ChoiceSpec]:
    return [ChoiceSpec(0, prompt, SamplingParams())]


def test_echo_with_logprobs_when_the_deadline_passed_before_the_prompt_was_scored() -> None:
    """The fuzz found it: with X-Request-Timeout passed before the engine answered, the
    choice ends at once, without the prompt's logprobs, and the echoed prompt's tokens had
    no logprob entries to pair with (a 500 from zip(strict=True)). They are null now."""
    req = parse_body(CompletionRequest, {"prompt": "abc", "echo": True, "logprobs": 1})
    output = CompletionOutput(HEAD, _specs([0, 1, 2]), [Prompt([0, 1, 2], "abc")], req,
                              TEXT_OF)
    output.add(ChoiceDelta(0, "", [], None, None, "length", None, 3, 0, 0, first=True))
    [choice] = output.body()["choices"]
    assert choice["text"] == "abc"
    assert choice["logprobs"] == {
        "tokens": ["a", "b", "c"], "token_logprobs": [None, None, None],
        "top_logprobs": [None, None, None], "text_offset": [0, 1, 2]}


class _Broken:
    """A generation whose next delta meets a bug."""

    finished = False

    async def next(self) -> list[ChoiceDelta]:
        raise ValueError("a bug")


async def _body(output: Output) -> list[str]:
    body = b"".join([part async for part in _events(_Broken(), output)])  # type: ignore[arg-type]
    return [block.removeprefix("data: ") for block in body.decode().split("\n\n") if block]


@pytest.mark.parametrize("route", ["completions", "chat"])
async def test_a_bug_mid_stream_ends_the_stream_as_documented(
        route: str, caplog: pytest.LogCaptureFixture) -> None:
    """An exception other than an APIError after the status line went out used to cut the
    response off mid-body (no [DONE]); it is an in-band 500 error event, then [DONE], and
    its traceback is logged."""
    output: Any
    if route == "completions":
        req = parse_body(CompletionRequest, {"prompt": "a", "stream": True})
        output = CompletionOutput(HEAD, _specs([0]), [Prompt([0], "a")], req, TEXT_OF)
    else:
        creq = parse_body(ChatCompletionRequest, {"messages": [{"role": "user",
                                                                "content": "a"}]})
        output = ChatOutput(HEAD, _specs([0]), plan_tools(creq), options=None, logprobs=None)
    *events, done = await _body(output)
    assert done == "[DONE]"
    assert [json.loads(e) for e in events] == [{"error": {
        "message": "internal server error (ValueError)", "type": "InternalServerError",
        "param": None, "code": 500}}]
    assert "a bug" in caplog.text
