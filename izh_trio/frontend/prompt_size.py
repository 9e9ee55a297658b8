"""Prompts too long for the model, known by their length alone, before they are tokenized.

Tokenizing a prompt of megabytes takes the tokenizer seconds and gigabytes
(``tools/bench/results/frontend.md``), only to learn that it has millions of tokens where the
model takes thousands. No token can stand for more text than
the vocabulary's longest token (``chars_per_token``: its text, in characters; special and
added tokens count with their text), so a text of more than ``max_model_len`` times that many
characters cannot fit, and is refused as the tokenized path would refuse it (400,
``context_length_exceeded``) without being tokenized.

The bound holds only where every character of the input ends up inside some token. Some
tokenizers drop text (whitespace splitters, control-character cleaning, a ``[UNK]`` for a
whole unknown word): there a megabyte of spaces may be no tokens at all, so no bound is
used (``chars_per_token`` None) and big prompts are merely tokenized off the event loop.
Unicode composition (NFC, NFKC) can turn up to :data:`COMPOSE_SHRINK` characters into one;
ASCII text never composes, so the factor applies to non-ASCII text only.

Lengths are counted in characters: ``len`` and ``isascii`` are O(1) on a ``str``, and a
character is at least one byte of the tokenizer's input, so the count is never more than
the text's UTF-8 length.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
from tokenizers import Tokenizer

from izh_trio.frontend.errors import APIError

#: NFC/NFKC map at most this many characters to one (U+1F82 is 4 characters in NFD;
#: Hangul syllables 3), so a normalized text is at least 1/4 as long as the input.
COMPOSE_SHRINK = 4
_COMPOSING = frozenset({"NFC", "NFKC"})
#: Pre-tokenizers that keep every character (split, map one to one, or add).
_KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Metaspace", "Punctuation", "Digits",
                                     "UnicodeScripts", "FixedLength"})


@attrs.frozen
class Shrink:
    """How many input characters one normalized character may stand for, at most: for
    ASCII text and for any text. None: the pipeline may drop text, so there is no bound."""

    ascii: float | None = 1.0
    any: float | None = 1.0

    def then(self, other: Shrink) -> Shrink:
        return Shrink(_times(self.ascii, other.ascii), _times(self.any, other.any))


LOSSY = Shrink(None, None)


def _times(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a * b


def _normalizer_shrink(spec: dict[str, Any] | None, *, ascii_in: bool = True
                       ) -> tuple[Shrink, bool]:
    """The normalizer's shrink, and whether ASCII text is still ASCII after it (a composing
    normalizer after one that made ASCII into something else may compose that too)."""
    if spec is None:
        return Shrink(), ascii_in
    kind = spec.get("type")
    if kind == "Sequence":
        total = Shrink()
        for part in spec.get("normalizers") or ():
            shrink, ascii_in = _normalizer_shrink(part, ascii_in=ascii_in)
            total = total.then(shrink)
        return total, ascii_in
    if kind in _COMPOSING:
        return Shrink(1.0 if ascii_in else COMPOSE_SHRINK, float(COMPOSE_SHRINK)), ascii_in
    if kind in ("NFD", "NFKD", "Lowercase"):  # never shorter; ASCII stays ASCII
        return Shrink(), ascii_in
    if kind in ("Prepend", "ByteLevel"):  # never shorter, but may add non-ASCII text
        return Shrink(), False
    if kind == "Replace":  # a fixed string for a fixed string shrinks by their ratio
        pattern, content = (spec.get("pattern") or {}).get("String"), spec.get("content")
        if isinstance(pattern, str) and isinstance(content, str) and pattern and content:
            ratio = max(1.0, len(pattern) / len(content))
            return Shrink(ratio, ratio), ascii_in and content.isascii()
    return LOSSY, False  # Strip, StripAccents, BertNormalizer, Precompiled, Nmt, regex Replace


def _pre_tokenizer_shrink(spec: dict[str, Any] | None) -> Shrink:
    if spec is None:
        return Shrink()
    kind = spec.get("type")
    if kind == "Sequence":
        total = Shrink()
        for part in spec.get("pretokenizers") or ():
            total = total.then(_pre_tokenizer_shrink(part))
        return total
    if kind == "Split":
        return LOSSY if spec.get("behavior") == "Removed" else Shrink()
    return Shrink() if kind in _KEEPING_PRE_TOKENIZERS else LOSSY  # Whitespace, Bert...


def _model_keeps_text(spec: dict[str, Any]) -> bool:
    """Whether every input character lands in some token (no run of unknown text fused into
    one ``[UNK]``)."""
    kind = spec.get("type")
    if kind == "BPE":
        return not (spec.get("unk_token") is not None and spec.get("fuse_unk"))
    if kind == "Unigram":  # unknown characters are fused, unless they fall back to bytes
        return spec.get("unk_id") is None or bool(spec.get("byte_fallback"))
    return False  # WordPiece (a long word is one [UNK]), WordLevel (an unknown word is)


@attrs.frozen
class PromptSize:
    """The most characters one token can stand for, as far as the tokenizer allows a bound."""

    #: The longest token's text, in characters; None: this tokenizer may drop text.
    chars_per_token: int | None
    #: Input characters per normalized character, for ASCII text and for any text.
    shrink: Shrink = Shrink()

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> PromptSize:
        """Worked out once, at start-up, from the tokenizer's own description."""
        spec = json.loads(tokenizer.to_str())
        shrink = _normalizer_shrink(spec.get("normalizer"))[0].then(
            _pre_tokenizer_shrink(spec.get("pre_tokenizer")))
        if shrink.any is None or not _model_keeps_text(spec.get("model") or {}):
            return cls(None)
        # A byte-level vocabulary writes one byte as one character, and an input character
        # is at least one byte: a token's text length bounds the characters it covers.
        longest = max(map(len, tokenizer.get_vocab(with_added_tokens=True)), default=1)
        return cls(max(longest, 1), shrink)

    def check(self, text: str, max_model_len: int, *, param: str) -> None:
        """Refuse ``text`` (a 400 as the tokenized path gives) if its length alone proves it
        has more than ``max_model_len`` tokens. O(1)."""
        self.check_length(len(text), max_model_len, ascii_only=text.isascii(), param=param)

    def check_length(self, chars: int, max_model_len: int, *, ascii_only: bool,
                     param: str) -> None:
        most = self.longest(max_model_len, ascii_only=ascii_only)
        if most is not None and chars > most:
            raise _too_long("the prompt is", chars, most, max_model_len, param)

    def longest(self, max_model_len: int, *, ascii_only: bool = False) -> int | None:
        """The most characters a text that fits in ``max_model_len`` tokens can have (None:
        no bound with this tokenizer)."""
        factor = self.shrink.ascii if ascii_only else self.shrink.any
        if self.chars_per_token is None or factor is None:
            return None
        return int(max_model_len * self.chars_per_token * factor)

    def size_error(self, size: int, kind: str, max_model_len: int,
                   field: str | None) -> APIError:
        """The 400 for a string of ``size`` characters (``kind`` "text") in ``field`` of a
        request body, longer than any text that fits the context (``longest``), or for an
        array or object of ``size`` members (``kind`` "array"), more than the context has
        tokens; ``field`` is one whose content goes into the prompt."""
        where = f"'{field}' holds" if field else "the request holds"
        if kind == "text":
            most = self.longest(max_model_len)
            assert most is not None
            return _too_long(f"{where} a text", size, most, max_model_len, field)
        return APIError(400, f"This model's maximum context length is {max_model_len} "
                             f"tokens. However, {where} an array or object of {size} members, "
                             f"each of which takes a token at least (judged by its size, "
                             f"without tokenizing it)", param=field,
                        code="context_length_exceeded")


def _too_long(what: str, chars: int, most: int, max_model_len: int,
              param: str | None) -> APIError:
    return APIError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, {what} "
        f"{chars} characters long, and no text of more than {most} characters can fit in "
        f"{max_model_len} tokens with this model's tokenizer (judged by its size, without "
        f"tokenizing it). Please reduce the length of the prompt.",
        param=param, code="context_length_exceeded")


def message_text(messages: Any) -> tuple[int, bool]:
    """The characters of the messages' text (each ``content``: a string, or its text parts),
    and whether they are all ASCII: the size of a conversation, known before it is
    rendered (rendering holds the GIL for as long as the text is big).

    Surrounding whitespace is not counted (a template may ``trim`` content). A template
    that drops text (Qwen3's drops earlier turns' reasoning) could in principle render a
    conversation into fewer tokens than its text proves; only when that text alone is more
    than any prompt of ``max_model_len`` tokens could be, which no client sends but to load
    the server. A shape the template would refuse is left to its validation."""
    chars, ascii_only = 0, True
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        parts = [content] if isinstance(content, str) else (
            [p.get("text") for p in content if isinstance(p, dict)]
            if isinstance(content, list) else [])
        for text in parts:
            if isinstance(text, str):
                text = text.strip()
                chars += len(text)
                ascii_only = ascii_only and text.isascii()
    return chars, ascii_only
