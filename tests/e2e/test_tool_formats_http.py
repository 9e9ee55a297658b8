"""Each family's tool-call syntax through the real server (hypercorn, the engine subprocess)
and the official ``openai`` client: a tiny random checkpoint of the family, with the family's
official chat template (``tests/templates``) and its marker tokens. Random weights call no
tool of their own accord, so forced calls (``required``, a named tool) are what is checked:
they parse and validate, streamed deltas reassemble to the non-streamed calls, and the call
sent back with its result renders through the template. ``auto`` parsing is checked by
holding the output to a text in the family's syntax (a ``guided_choice``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest
from tokenizers import AddedToken, Tokenizer

from tests.e2e.conftest import assert_streamed_calls_match, free_port, running_server, serve_args
from tests.engine.test_llama_qwen2 import make_family

TEMPLATES = Path(__file__).parent.parent / "templates"
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "unit": {"enum": ["celsius", "fahrenheit"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET", "PST"]}},
        "required": ["tz"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What's the weather in Paris?"}]
#: family -> (architecture shape, template, bos, marker tokens, the syntax of one call)
FAMILIES: dict[str, tuple[str, str, str | None, tuple[str, ...], str]] = {
    "hermes": ("qwen2-yarn", "qwen2.5_instruct.jinja", None, (),
               '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'),
    "llama3_json": ("llama-mha-biases-llama3", "llama3.1_instruct.jinja", "<|begin_of_text|>",
                    ("<|python_tag|>", "<|start_header_id|>", "<|end_header_id|>",
                     "<|eot_id|>", "<|eom_id|>"),
                    '{"name": "get_time", "parameters": {"tz": "UTC"}}'),
    "mistral": ("mistral-window-32", "mistral7b_instruct_v0.3.jinja", "<s>",
                ("[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                 "[/TOOL_RESULTS]", "[INST]", "[/INST]"),
                '[TOOL_CALLS] [{"name": "get_time", "arguments": {"tz": "UTC"}}]'),
}


def make_checkpoint(family: str, out: Path, tiny_dir: Path) -> Path:
    shape, template, bos, markers, _ = FAMILIES[family]
    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    added = [t for t in (bos, *markers) if t is not None]
    make_family(shape, out, tiny_dir,
                vocab_size=tok.get_vocab_size(with_added_tokens=True) + len(added),
                max_position_embeddings=2048)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in added])
    tok.save(str(out / "tokenizer.json"))
    config = json.loads((out / "tokenizer_config.json").read_text())
    for text in added:
        config["added_tokens_decoder"][str(tok.token_to_id(text))] = {
            "content": text, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}
    if bos is not None:
        config["bos_token"] = bos
    config["chat_template"] = (TEMPLATES / template).read_text()
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           tiny_dir: Path) -> Iterator[tuple[str, str]]:
    root = tmp_path_factory.mktemp("tool-formats")
    model_dir = make_checkpoint(request.param, root / request.param, tiny_dir)
    port = free_port()
    args = serve_args(model_dir, port, "--served-model-name", "m")
    with running_server(args, root / "server.log", port=port) as (base, _proc):
        yield request.param, base


@pytest.fixture
def family(served: tuple[str, str]) -> tuple[str, openai.OpenAI]:
    name, base = served
    return name, openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def _check(family: str, calls: list, only: str | None = None) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and only in (None, call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        pattern = r"[A-Za-z0-9]{9}" if family == "mistral" else r"call_[0-9a-f]{24}"
        assert re.fullmatch(pattern, call.id), call.id


def test_forced_calls_parse_validate_and_come_back(family: tuple[str, openai.OpenAI]) -> None:
    name, client = family
    for seed in range(4):
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            out = client.chat.completions.create(
                model="m", messages=MESSAGES, tools=TOOLS, tool_choice=choice,
                temperature=1.0, seed=seed, max_tokens=200).choices[0]
            assert out.finish_reason == "tool_calls", out
            assert out.message.content is None
            only = None if choice == "required" else "get_weather"
            _check(name, out.message.tool_calls, only)
            if name == "llama3_json":  # the template says back one call per turn
                assert len(out.message.tool_calls) == 1
    # the second turn: the call and its result, by the call's id, through the template
    call = out.message.tool_calls[0]
    turn = [*MESSAGES, {"role": "assistant", "content": None,
                        "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
    again = client.chat.completions.create(model="m", messages=turn, tools=TOOLS,
                                           max_tokens=3)
    assert again.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_streamed_calls_reassemble_to_the_whole(family: tuple[str, openai.OpenAI]) -> None:
    _, client = family
    kwargs = dict(model="m", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                  temperature=1.0, max_tokens=300)
    for seed in range(3):
        assert_streamed_calls_match(client, kwargs, seed)


def test_auto_reads_calls_in_the_family_syntax(family: tuple[str, openai.OpenAI]) -> None:
    name, client = family
    text = FAMILIES[name][4]
    # Markers as the model writes them, each its one token (Mistral's is 2001: after the
    # tiny vocabulary and the bos), not their text spelled in other tokens.
    grammar = {"mistral": f"start: <[2001]> {json.dumps(text.removeprefix('[TOOL_CALLS]'))}",
               "hermes": f"start: <tool_call> {json.dumps(text[11:-12])} </tool_call>",
               }.get(name, f"start: {json.dumps(text)}")
    for stream in (False, True):
        kwargs = dict(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=80,
                      extra_body={"structured_outputs": {"grammar": grammar}})
        if not stream:
            out = client.chat.completions.create(**kwargs).choices[0]
            assert (out.finish_reason, out.message.content) == ("tool_calls", None)
            got = [(c.function.name, json.loads(c.function.arguments))
                   for c in out.message.tool_calls]
        else:
            calls: dict[int, list] = {}
            content = ""
            for chunk in client.chat.completions.create(**kwargs, stream=True):
                for c in chunk.choices:
                    content += c.delta.content or ""
                    for tc in c.delta.tool_calls or []:
                        if tc.id is not None:
                            calls[tc.index] = [tc.function.name, ""]
                        calls[tc.index][1] += tc.function.arguments or ""
            assert content == ""
            got = [(n, json.loads(a)) for n, a in (calls[i] for i in sorted(calls))]
        assert got == [("get_time", {"tz": "UTC"})]


def test_reasoning_only_where_the_family_thinks(family: tuple[str, openai.OpenAI]) -> None:
    """None of these families thinks in <think> (Qwen2.5's template has no think block):
    such text is content, never reasoning."""
    _, client = family
    out = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=40,
        extra_body={"structured_outputs": {"grammar": 'start: <think> "hm" </think> "ok"'}})
    message = out.choices[0].message
    assert message.content == "<think>hm</think>ok"
    assert getattr(message, "reasoning_content", None) is None


def test_client_made_call_ids_come_back_through_the_template(
        family: tuple[str, openai.OpenAI]) -> None:
    """Ids the client made itself (an agent replaying its history) render too: Mistral's
    template, which takes only 9 alphanumerics, is shown ids derived from them."""
    _, client = family
    turn = [*MESSAGES,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_made_by_the_client", "type": "function",
                 "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]},
            {"role": "tool", "tool_call_id": "call_made_by_the_client", "content": "12:00"}]
    out = client.chat.completions.create(model="m", messages=turn, tools=TOOLS, max_tokens=3)
    assert out.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_messages_api_tool_use_round_trip(served: tuple[str, str]) -> None:
    """Anthropic's Messages API on the family: a forced tool_use whose input validates, and
    its tool_result sent back by its ``toolu_`` id."""
    name, base = served
    claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=120)
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
             for t in TOOLS]
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    out = claude.messages.create(model="m", max_tokens=200, messages=ask, tools=tools,
                                 tool_choice={"type": "any"})
    assert out.stop_reason == "tool_use"
    uses = [b for b in out.content if b.type == "tool_use"]
    assert uses
    for use in uses:
        jsonschema.validate(use.input, SCHEMAS[use.name])
    again = claude.messages.create(
        model="m", max_tokens=3, tools=tools,
        messages=[*ask, {"role": "assistant", "content": [u.model_dump() for u in uses]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id,
                                                "content": "21 C"} for u in uses]}])
    assert again.stop_reason in ("max_tokens", "end_turn", "tool_use"), name


def test_the_setting_overrides_the_checkpoint(tmp_path: Path, tiny_dir: Path) -> None:
    """``--tool-call-parser`` wins over what the checkpoint says: a Llama checkpoint told
    ``mistral`` is held to ``[TOOL_CALLS]`` lists, answered with Mistral's ids."""
    model_dir = make_checkpoint("llama3_json", tmp_path / "llama", tiny_dir)
    port = free_port()
    args = serve_args(model_dir, port, "--served-model-name", "m",
                      "--tool-call-parser", "mistral")
    with running_server(args, tmp_path / "server.log", port=port) as (base, _proc):
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        out = client.chat.completions.create(
            model="m", messages=MESSAGES, tools=TOOLS, tool_choice="required",
            temperature=1.0, seed=0, max_tokens=200, logprobs=True).choices[0]
        _check("mistral", out.message.tool_calls)
        # the tokens said the list: [TOOL_CALLS] spelled in text (no such token here) and "["
        said = "".join(t.token for t in out.logprobs.content)
        assert said.startswith("[TOOL_CALLS][{"), said
