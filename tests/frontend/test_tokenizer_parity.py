"""Our tokenizer equals transformers' ``AutoTokenizer`` on the same checkpoint directory.

Encode (with and without special tokens) and decode (skipping special tokens or not, whole
and streamed id by id) are compared on a corpus of mixed text, chat markers and Unicode, and
on random id sequences (which split characters and scatter special tokens), for checkpoints
whose tokenizer files were built differently.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import transformers

from izh_trio.frontend.chat_parser import MARKERS
from izh_trio.frontend.tokenizer import ModelTokenizer
from tests.conftest import save_disagreeing_tokenizer

CORPUS = [
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\r\nwindows\nnewlines\n\n\n",
    "<think>\nLet me see.\n</think>\n\nThe answer is 42.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>',
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text<|im_end|>",
    "<tool_response>\n{\"temp\": 21.5}\n</tool_response>",
    "< think> <think <tool_call/> </ tool_call>",
    "你好，世界！今天天气很好。",  # noqa: RUF001 (full-width punctuation on purpose)
    "Ελληνικά, русский, עברית, العربية",
    "emoji 🙂👍🏽 family 👨‍👩‍👧 flags 🇨🇭",
    "cafe\u0301 vs café (NFC folds the combining accent)",
    "zero\u200bwidth and\u00a0nbsp",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n",
    "Don't we've they're I'm it's . , ? ! ' '",
    "\x00control\x07chars\x7f",
    "",
    "🙂" * 9,
]


def _build(kind: str, tiny_dir: Path, out: Path) -> Path:
    """Tokenizer files only: what both tokenizers read."""
    if kind == "tiny":
        return tiny_dir
    if kind == "hub_disagreement":
        return save_disagreeing_tokenizer(tiny_dir, out)
    shutil.copy(tiny_dir / "tokenizer.json", out / "tokenizer.json")
    config = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    if kind == "config_only_tokens":
        # Tokens declared only in the config, special or not, and one named in its special
        # token list alone; a BOS/EOS post-processor the config asks for.
        config["added_tokens_decoder"].update({
            "2000": {"content": "<|fim_prefix|>", "special": True, "normalized": False,
                     "lstrip": False, "rstrip": False, "single_word": False},
            "2001": {"content": "<tool_sep>", "special": False, "normalized": False,
                     "lstrip": False, "rstrip": False, "single_word": False},
        })
        config["additional_special_tokens"] = [*config["additional_special_tokens"],
                                               "<|only_listed|>"]
        config["bos_token"] = "<|endoftext|>"
        config["add_bos_token"] = True
        config["add_eos_token"] = True
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


KINDS = ["tiny", "hub_disagreement", "config_only_tokens"]


@pytest.fixture(scope="module", params=KINDS)
def pair(request: pytest.FixtureRequest, tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[ModelTokenizer, transformers.PreTrainedTokenizerBase]:
    kind = request.param
    directory = _build(kind, tiny_dir, tmp_path_factory.mktemp(kind))
    return ModelTokenizer(directory), transformers.AutoTokenizer.from_pretrained(directory)


def _corpus(ref: transformers.PreTrainedTokenizerBase) -> list[str]:
    added = [t.content for t in ref.added_tokens_decoder.values()]
    return [*CORPUS, " ".join(added), "x".join(added) + "tail", "".join(MARKERS)]


def test_added_tokens_and_flags_match(pair) -> None:
    ours, ref = pair
    got = {i: (t.content, t.special) for i, t in ours.tokenizer.get_added_tokens_decoder().items()}
    want = {i: (t.content, t.special) for i, t in ref.added_tokens_decoder.items()}
    assert got == want
    assert ours.vocab_size == len(ref)


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_encode_matches(pair, add_special_tokens: bool) -> None:
    ours, ref = pair
    for text in _corpus(ref):
        assert ours.encode(text, add_special_tokens=add_special_tokens) == ref.encode(
            text, add_special_tokens=add_special_tokens), text


def _streamed(ours: ModelTokenizer, ids: list[int], skip: bool, rng: random.Random) -> str:
    detok = ours.detokenizer(skip)
    out, i = [], 0
    while i < len(ids):  # in chunks of 1 to 3 ids, as the engine's steps deliver them
        n = rng.randint(1, 3)
        out.append(detok.push(ids[i:i + n]))
        i += n
    return "".join(out) + detok.finish()


@pytest.mark.parametrize("skip", [True, False])
def test_decode_matches_whole_and_streamed(pair, skip: bool) -> None:
    ours, ref = pair
    rng = random.Random(7)
    cases = [ref.encode(text, add_special_tokens=True) for text in _corpus(ref)]
    cases += [[rng.randrange(len(ref)) for _ in range(rng.randint(1, 40))] for _ in range(300)]
    for ids in cases:
        want = ref.decode(ids, skip_special_tokens=skip)
        assert ours.decode(ids, skip_special_tokens=skip) == want, ids
        assert _streamed(ours, ids, skip, rng) == want, ids


def test_chat_markers_stay_in_the_text_a_parser_reads(pair) -> None:
    """Whatever the checkpoint calls them, the markers reach the chat parser, while the
    other special tokens are still skipped."""
    ours, ref = pair
    ids = ref.encode("<think>a</think>b<|im_end|><tool_call>\n{}\n</tool_call>",
                     add_special_tokens=False)
    detok = ours.detokenizer(True, keep=ours.ids_of(MARKERS))
    assert detok.push(ids) + detok.finish() == "<think>a</think>b<tool_call>\n{}\n</tool_call>"
