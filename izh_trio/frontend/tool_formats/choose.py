"""Which tool-call syntax a checkpoint speaks, read from its chat template and its tokens,
unless ``--tool-call-parser`` names one.

``auto``: the template's text decides first (what it writes back is what the model was
taught), then the tokenizer's tokens: ``[TOOL_CALLS]`` -> mistral, ``<tool_call>`` ->
hermes, ``<|python_tag|>`` or an ``ipython`` role -> llama3_json; anything else -> hermes,
as before (calls are only looked for when a request offers tools, and a template that
cannot show tools fails on its own)."""

from __future__ import annotations

from collections.abc import Callable

from izh_trio.frontend.chat_parser import THINK_OPEN
from izh_trio.frontend.tool_formats.base import ToolFormat
from izh_trio.frontend.tool_formats.hermes import Hermes
from izh_trio.frontend.tool_formats.llama3_json import PYTHON_TAG, Llama3Json
from izh_trio.frontend.tool_formats.mistral import TOOL_CALLS, Mistral

TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json", "mistral")


def _detect(template: str, has_token: Callable[[str], bool]) -> str:
    if TOOL_CALLS in template:
        return "mistral"
    if "<tool_call>" in template:
        return "hermes"
    if PYTHON_TAG in template or "ipython" in template:
        return "llama3_json"
    for token, name in ((TOOL_CALLS, "mistral"), ("<tool_call>", "hermes"),
                        (PYTHON_TAG, "llama3_json")):
        if has_token(token):
            return name
    return "hermes"


def choose_tool_format(setting: str, template: str | None,
                       token_id: Callable[[str], int | None]) -> ToolFormat:
    """The format ``setting`` names, or for ``auto`` the checkpoint's; ``token_id``: a
    text's id where it is one token of the vocabulary."""
    source = template or ""
    name = _detect(source, lambda t: token_id(t) is not None) if setting == "auto" else setting
    if name == "mistral":
        return Mistral(marker_id=token_id(TOOL_CALLS))
    if name == "llama3_json":
        return Llama3Json()
    if name != "hermes":
        raise ValueError(f"unknown tool-call parser {setting!r}")
    # Reasoning only where the family has it: Qwen3's template opens <think>, Qwen2.5's
    # does not (a vocabulary may hold the tag without the model ever thinking in it).
    return Hermes(reasoning=THINK_OPEN in source)
