"""The checkpoint's tokenizer and generation defaults, as the frontend needs them.

Only ``tokenizers`` (Rust) is used: no transformers, no torch in the HTTP process; the
files are read as transformers reads them (``tokenizer_loading``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from izh_trio.frontend.chat_template import ChatTemplate
from izh_trio.frontend.detokenizer import IncrementalDetokenizer
from izh_trio.frontend.prompt_literals import RenderedPrompt
from izh_trio.frontend.tokenizer_loading import clean_up_tokenization, load_tokenizer

log = logging.getLogger(__name__)

#: Texts (characters) and id lists longer than this are encoded and decoded by the
#: tokenizer's batch calls, which release the GIL; shorter ones by the plain calls, which
#: cost less. (A batch of one runs in the calling thread once parallelism is off.)
_GIL_FREE_FROM = 1024
# tokenizers runs a batch on its rayon pool unless told not to; a batch of one gains
# nothing from that, and once the pool was used, the library warns on the engine core's
# stderr at every fork (a respawn) that it turns parallelism off. The operator may set it.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _bounded(default: float, low: float, high: float, *, open_low: bool = False) -> Any:
    """A sampling default, bounded as a request's own value is."""
    low_check = attrs.validators.gt(low) if open_low else attrs.validators.ge(low)
    return attrs.field(default=default, validator=[low_check, attrs.validators.le(high)])


@attrs.frozen
class GenerationDefaults:
    """Sampling values a request leaves unset: ``generation_config.json``'s, else neutral ones."""

    temperature: float = _bounded(1.0, 0.0, 2.0)
    top_p: float = _bounded(1.0, 0.0, 1.0, open_low=True)
    top_k: int = _bounded(0, -1, 1 << 31)
    min_p: float = _bounded(0.0, 0.0, 1.0)
    repetition_penalty: float = _bounded(1.0, 0.0, 10.0, open_low=True)

    @classmethod
    def from_file(cls, path: Path) -> GenerationDefaults:
        """The file's values where they are numbers a request could give; others are logged
        and left at the neutral default, so a checkpoint's odd config cannot stop the server."""
        if not path.is_file():
            return cls()
        raw = json.loads(path.read_text())
        fields: dict[str, Any] = {}
        for field in attrs.fields(cls):
            value = raw.get(field.name)
            if value is None:
                continue
            usable = isinstance(value, int | float) and not isinstance(value, bool)
            try:
                if usable and field.validator is not None:
                    field.validator(None, field, value)
            except ValueError:
                usable = False
            if not usable:
                log.warning("%s: %s=%r is not a usable default; using %r", path.name,
                            field.name, value, field.default)
                continue
            fields[field.name] = value
        if raw.get("do_sample") is False:  # the checkpoint asks for greedy decoding
            fields["temperature"] = 0.0
        return cls(**fields)


class ModelTokenizer:
    def __init__(self, model_dir: Path) -> None:
        config_path = model_dir / "tokenizer_config.json"
        self.config: dict[str, Any] = (
            json.loads(config_path.read_text()) if config_path.is_file() else {}
        )
        loaded = load_tokenizer(model_dir, self.config)
        self.tokenizer = loaded.tokenizer
        self._clean_up = loaded.clean_up_spaces
        # transformers >= 4.43 may write the template beside the config instead of inside it.
        template_file = model_dir / "chat_template.jinja"
        if template_file.is_file():
            self.config = {**self.config, "chat_template": template_file.read_text()}
        self.chat_template = ChatTemplate.from_tokenizer_config(self.config)
        specials = [t for t in self.tokenizer.get_added_tokens_decoder().values() if t.special]
        if self.chat_template is not None:
            self.chat_template.special_texts = frozenset(t.content for t in specials)
        # What each special token's text is as plain text, for client text in a prompt.
        self.tokenizer.encode_special_tokens = True
        self._as_text = {t.content: self.tokenizer.encode(t.content,
                                                          add_special_tokens=False).ids
                         for t in specials}
        self.tokenizer.encode_special_tokens = bool(self.config.get("split_special_tokens"))
        self.defaults = GenerationDefaults.from_file(model_dir / "generation_config.json")
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.special_ids = frozenset(
            i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Text to ids; special-token text in it is parsed as the special token. A rendered
        chat prompt carries its own BOS, so only raw completions prompts ask for one."""
        if len(text) <= _GIL_FREE_FROM:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        # The batch call releases the GIL while it works (``encode`` holds it): a long text
        # is encoded in a worker thread (``offload``) while the event loop runs on. The fast
        # one (tokenizers >= 0.21) skips the character offsets, which no caller wants.
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        return encode([text], add_special_tokens=add_special_tokens)[0].ids

    def encode_prompt(self, prompt: RenderedPrompt) -> list[int]:
        """A rendered chat prompt to ids: the template's own special-token text as control
        tokens, the client's (its literal spans) as the plain text it is."""
        if not prompt.literal_spans:
            return self.encode(prompt.text)
        ids: list[int] = []
        pos = 0
        for start, end in prompt.literal_spans:
            ids += self.encode(prompt.text[pos:start]) if start > pos else []
            ids += self._as_text[prompt.text[start:end]]
            pos = end
        return ids + (self.encode(prompt.text[pos:]) if pos < len(prompt.text) else [])

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if len(ids) <= _GIL_FREE_FROM:
            text = self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        else:  # as in encode: the batch call releases the GIL
            text = self.tokenizer.decode_batch([ids],
                                               skip_special_tokens=skip_special_tokens)[0]
        return clean_up_tokenization(text) if self._clean_up else text

    def ids_of(self, texts: Iterable[str]) -> frozenset[int]:
        """The ids of those texts that are single tokens of the vocabulary."""
        return frozenset(i for t in texts if (i := self.tokenizer.token_to_id(t)) is not None)

    def detokenizer(self, skip_special_tokens: bool = True,
                    keep: frozenset[int] = frozenset()) -> IncrementalDetokenizer:
        """A stream decoder for one output; ``keep``: special ids shown even when skipping."""
        skip = self.special_ids - keep if skip_special_tokens else frozenset()
        return IncrementalDetokenizer(self.tokenizer, skip, clean_up_spaces=self._clean_up)
