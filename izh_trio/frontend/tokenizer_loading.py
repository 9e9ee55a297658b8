"""Build a checkpoint's tokenizer as transformers' ``AutoTokenizer`` does, from the same files.

``tokenizer.json`` alone is not the tokenizer a checkpoint's authors tested with:
transformers layers ``tokenizer_config.json`` on top, and where the two disagree the config
wins. Hub checkpoints exist whose ``tokenizer.json`` marks ``<tool_call>`` or ``<think>``
special while the config's ``added_tokens_decoder`` says they are not; read alone, such a
file drops those markers from decoded text and every tool call is lost. So, in
transformers' order:

1. the file's added tokens take the flags the config's ``added_tokens_decoder`` gives them,
   and the tokens it declares that the file lacks are appended, in id order;
2. the named special tokens (``bos_token``, ``eos_token``, ...) and
   ``additional_special_tokens`` / ``extra_special_tokens`` that nothing added yet are added
   as special (a named one declared in ``added_tokens_decoder`` is special whatever it says);
3. ``add_bos_token`` / ``add_eos_token`` are left to ``tokenizer.json``'s post-processor,
   which transformers (5.x) also lets decide whenever that file exists;
4. ``split_special_tokens`` and ``clean_up_tokenization_spaces`` are kept for encode and
   decode (transformers ignores the latter for BPE models, which it would corrupt).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import attrs
from tokenizers import AddedToken, Tokenizer

log = logging.getLogger(__name__)

_NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")
_ADDED_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


@attrs.frozen
class LoadedTokenizer:
    tokenizer: Tokenizer
    #: Apply transformers' ``clean_up_tokenization`` to decoded text.
    clean_up_spaces: bool


def _added_token(spec: Any, *, special: bool | None = None) -> AddedToken | None:
    """A config's token entry (a string or a serialized ``AddedToken``) as an AddedToken."""
    if isinstance(spec, str):
        content, flags = spec, {}
    elif isinstance(spec, dict) and isinstance(spec.get("content"), str):
        content = spec["content"]
        flags = {k: bool(spec[k]) for k in _ADDED_TOKEN_FLAGS if k in spec}
    else:
        return None
    if special is not None:
        flags["special"] = special
    if flags.get("special") and "normalized" not in flags:
        flags["normalized"] = False  # as transformers adds special tokens
    return AddedToken(content, **flags)


def _special_token_specs(config: dict[str, Any]) -> tuple[set[str], list[Any]]:
    """The named special tokens' texts, and every special token the config lists."""
    named = [config.get(name) for name in _NAMED_SPECIAL]
    specs: list[Any] = [s for s in named if s is not None]
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra = config.get(key)
        if isinstance(extra, dict):  # model-specific names -> tokens
            extra = list(extra.values())
        if isinstance(extra, list):
            specs += extra
    return {c for s in named if (c := _content(s)) is not None}, specs


def _declared_tokens(config: dict[str, Any], named: set[str]) -> list[tuple[int, AddedToken]]:
    """The config's ``added_tokens_decoder``, in id order, with its flags."""
    entries: list[tuple[int, AddedToken]] = []
    decoder = config.get("added_tokens_decoder")
    for key, spec in (decoder.items() if isinstance(decoder, dict) else ()):
        token = _added_token(spec)
        if token is not None and token.content in named:  # special whatever it says
            token = _added_token(spec, special=True)
        if token is not None and str(key).isdigit():
            entries.append((int(key), token))
    return sorted(entries, key=lambda e: e[0])


def _with_declared_flags(tokenizer_json: dict[str, Any],
                         declared: list[tuple[int, AddedToken]]) -> bool:
    """Give the file's added tokens the config's flags before the tokenizer is built
    (re-adding a token to a built one updates its flags but not what decode skips).
    Returns whether anything changed."""
    by_content = {t.content: t for _, t in declared}
    changed = False
    for entry in tokenizer_json.get("added_tokens") or ():
        token = by_content.get(entry.get("content"))
        if token is None:
            continue
        flags = {flag: getattr(token, flag) for flag in _ADDED_TOKEN_FLAGS}
        changed |= any(entry.get(k) != v for k, v in flags.items())
        entry.update(flags)
    return changed


def _add_missing_tokens(tok: Tokenizer, declared: list[tuple[int, AddedToken]],
                        special_specs: list[Any]) -> None:
    present = {t.content for t in tok.get_added_tokens_decoder().values()}
    new = [token for _, token in declared if token.content not in present]
    if new:
        tok.add_tokens(new)
    for want, token in declared:
        got = tok.token_to_id(token.content)
        if got != want:  # ids follow the vocabulary's end, as in transformers
            log.warning("tokenizer: %r is declared as id %d but got id %s",
                        token.content, want, got)
    # Special tokens the config names but nothing added yet: added as special. Ones already
    # added keep the flags they were given (transformers does not re-flag them).
    present = {t.content for t in tok.get_added_tokens_decoder().values()}
    missing = [t for s in special_specs
               if (t := _added_token(s, special=True)) is not None and t.content not in present]
    if missing:
        tok.add_tokens(missing)


def _content(spec: Any) -> str | None:
    if isinstance(spec, dict):
        spec = spec.get("content")
    return spec if isinstance(spec, str) else None


def load_tokenizer(model_dir: Path, config: dict[str, Any]) -> LoadedTokenizer:
    """The checkpoint's tokenizer with ``config`` (its ``tokenizer_config.json``) applied."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir} has no tokenizer.json")
    named, special_specs = _special_token_specs(config)
    declared = _declared_tokens(config, named)
    text = path.read_text(encoding="utf-8")
    tokenizer_json = json.loads(text)
    if _with_declared_flags(tokenizer_json, declared):
        text = json.dumps(tokenizer_json)
    tok = Tokenizer.from_str(text)
    _add_missing_tokens(tok, declared, special_specs)
    if config.get("split_special_tokens"):
        tok.encode_special_tokens = True
    clean_up = (bool(config.get("clean_up_tokenization_spaces"))
                and type(tok.model).__name__ != "BPE")
    return LoadedTokenizer(tok, clean_up)


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization``: spaces a word-piece decode left before
    punctuation and contractions (the same replacements, in the same order)."""
    return (text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",")
            .replace(" ' ", "'").replace(" n't", "n't").replace(" 'm", "'m")
            .replace(" 's", "'s").replace(" 've", "'ve").replace(" 're", "'re"))
