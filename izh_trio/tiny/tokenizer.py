"""Train a Qwen3-shaped byte-level BPE tokenizer offline, from text that ships with Python.

No download is allowed, so the training corpus is assembled from the standard library's own
docstrings, the Zen of Python, the chat template, and deterministic synthetic chat/JSON lines.
"""

from __future__ import annotations

import ast
import codecs
import importlib
import importlib.resources
import importlib.util
import inspect
import json
import sys
from collections.abc import Iterator
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

# Qwen2/Qwen3's pre-tokenizer split: contractions, letter runs, single digits, punctuation runs.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Appended right after the BPE vocab, in this order (as in Qwen3's real tokenizer).
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
ALL_ADDED_TOKENS: tuple[str, ...] = SPECIAL_TOKENS + ADDED_TOKENS

# Pure-Python (or long-stable C) modules with platform-independent public APIs; sorted so the
# corpus order never depends on anything but this list.
_DOC_MODULES: tuple[str, ...] = tuple(
    sorted(
        (
            "argparse",
            "base64",
            "bisect",
            "calendar",
            "collections",
            "colorsys",
            "csv",
            "dataclasses",
            "difflib",
            "enum",
            "fnmatch",
            "fractions",
            "functools",
            "heapq",
            "html",
            "itertools",
            "json",
            "keyword",
            "operator",
            "pprint",
            "queue",
            "random",
            "re",
            "shlex",
            "statistics",
            "string",
            "textwrap",
            "urllib.parse",
            "uuid",
        )
    )
)

_TEMPLATE_NAME = "qwen3_chat_template.jinja"


def chat_template_text() -> str:
    """The Qwen3 chat template shipped as package data (read, never rendered, here)."""
    return (
        importlib.resources.files(__package__).joinpath(_TEMPLATE_NAME).read_text(encoding="utf-8")
    )


def _zen_of_python() -> str:
    """Decode ``this.s`` without importing ``this`` (importing it prints to stdout)."""
    loaded = sys.modules.get("this")
    if loaded is not None:
        return codecs.decode(loaded.s, "rot13")
    spec = importlib.util.find_spec("this")
    source = spec.loader.get_source("this") if spec and spec.loader else None  # type: ignore[attr-defined]
    if not source:
        return ""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "s" for t in node.targets
        ):
            return codecs.decode(ast.literal_eval(node.value), "rot13")
    return ""


def _stdlib_docs() -> Iterator[str]:
    """Docstrings of the fixed module list and their own public functions and classes."""
    for name in _DOC_MODULES:
        module = importlib.import_module(name)
        if doc := inspect.getdoc(module):
            yield doc
        for attr in sorted(vars(module)):
            if attr.startswith("_"):
                continue
            obj = vars(module)[attr]
            if not (inspect.isclass(obj) or inspect.isroutine(obj)):
                continue
            if getattr(obj, "__module__", None) != name:
                continue  # re-exports would duplicate text and depend on import order
            if doc := inspect.getdoc(obj):
                yield f"{attr}\n{doc}"


# Vocabulary for the synthetic lines; split at use.
_WORD_TEXT = (
    "weather city tool search query result name arguments location unit celsius fahrenheit "
    "time date user assistant system content message role function type object string number "
    "boolean array properties required description value items error status ok true false "
    "null hello world please thanks answer question think reason step first then finally "
    "because"
)


def _synthetic_chat() -> Iterator[str]:
    """Chat- and JSON-shaped lines, enumerated arithmetically so they are identical everywhere."""
    words = _WORD_TEXT.split()
    n = len(words)
    for i in range(400):
        a, b, c, d = (words[(i * k + k * k) % n] for k in (3, 5, 7, 11))
        num = (i * 37) % 1000
        yield (
            f'{{"name": "get_{a}_{b}", "arguments": {{"{c}": "{d} {num}", "count": {i % 17}, '
            f'"flag": {"true" if i % 2 else "false"}, "list": [{num}, {i}, null]}}}}'
        )
        yield f"<|im_start|>user\nWhat is the {a} of the {b} {c}? {num}<|im_end|>"
        yield (
            f"<|im_start|>assistant\n<think>\nThe user asks about {a} and {d}.\n</think>\n\n"
            f'<tool_call>\n{{"name": "{a}", "arguments": {{"{b}": {num}}}}}\n</tool_call>'
            "<|im_end|>"
        )
        yield f'<tool_response>\n{{"{c}": "{d}", "value": {num}.{i % 10}}}\n</tool_response>'


def training_corpus() -> list[str]:
    """The whole training text, in a fixed order."""
    return [_zen_of_python(), chat_template_text(), *_stdlib_docs(), *_synthetic_chat()]


def train_tokenizer(vocab_size: int, learned: int | None = None) -> Tokenizer:
    """Train the BPE to ``learned`` (default ``vocab_size``) minus the added tokens, fill it
    up to ``vocab_size`` minus them with filler tokens, then append the added tokens."""
    bpe_size = (learned or vocab_size) - len(ALL_ADDED_TOKENS)
    tok = Tokenizer(
        BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    trainer = BpeTrainer(
        vocab_size=bpe_size,
        min_frequency=0,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # Training is deterministic whatever RAYON_NUM_THREADS is (ties break on pair ids, not on
    # thread timing); the tests rebuild under a different thread count to keep that true.
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    got = tok.get_vocab_size(with_added_tokens=False)
    if got != bpe_size:
        raise RuntimeError(f"BPE trained to {got} tokens, wanted {bpe_size}; corpus too small?")
    # The trainer replaces the model and drops these to null; Qwen's file (and transformers'
    # rebuild of it) has empty strings, so match that for an identical round trip.
    tok.model.continuing_subword_prefix = ""
    tok.model.end_of_word_suffix = ""
    if learned is not None and learned < vocab_size:
        tok = _with_fillers(tok, vocab_size - len(ALL_ADDED_TOKENS))

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    total = tok.get_vocab_size(with_added_tokens=True)
    if total != vocab_size:
        raise RuntimeError(f"tokenizer has {total} tokens, wanted {vocab_size}")
    return tok


def _with_fillers(tok: Tokenizer, size: int) -> Tokenizer:
    """``tok``'s BPE with vocabulary entries up to ``size``: `` <id>`` each, without merges,
    so that no text encodes to them and each decodes to its own text."""
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    fillers = {f"\u0120<{i}>": i for i in range(len(vocab), size)}  # \u0120: a space
    if set(fillers) & set(vocab):
        raise RuntimeError("a filler token is a learned one")
    vocab.update(fillers)
    return Tokenizer.from_str(json.dumps(data))


def tokenizer_config(tok: Tokenizer, model_max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json`` in the shape Qwen3 checkpoints ship."""
    decoder: dict[str, dict[str, Any]] = {}
    for content in ALL_ADDED_TOKENS:
        decoder[str(tok.token_to_id(content))] = {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": content in SPECIAL_TOKENS,
        }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": chat_template_text(),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
