"""Token ids to text as they arrive, never splitting a UTF-8 character across chunks."""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def push(self, token_ids: list[int]) -> str:
        """Feed new ids; return the text they completed (may be empty)."""
        if not token_ids:
            return ""
        return self._stream.step(self._tokenizer, token_ids) or ""
