"""Token ids to text as they arrive, never splitting a UTF-8 character across chunks.

The text streamed for a sequence of ids, once :meth:`IncrementalDetokenizer.finish` is
called, is exactly the whole-sequence decode of those ids (the tests compare it with
transformers'): ``DecodeStream`` holds back ids that end inside a character, and would keep
an output that ends in broken bytes forever; ``finish`` hands that tail over as the whole
decode does (as U+FFFD).

Special tokens are skipped here, by id, rather than by ``DecodeStream``'s flag: a chat
parser needs its markers (``<think>``, ``<tool_call>``) whatever the checkpoint calls
them, so the ids to keep are decided per request.
"""

from __future__ import annotations

from collections.abc import Collection

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from izh_trio.frontend.tokenizer_loading import clean_up_tokenization

#: Characters at the end of a cleaned stream that more text could still change.
_CLEAN_UP_REACH = 16


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_ids: Collection[int] = frozenset(),
                 *, clean_up_spaces: bool = False) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=False)
        self._skip = skip_ids
        self._ids: list[int] = []
        self._chars = 0  # decoded characters handed out so far (before clean-up)
        self._held = False  # the last step returned nothing: DecodeStream may hold ids
        self._clean_up = clean_up_spaces
        self._raw = ""  # with clean-up: the whole text so far, and how much of it was sent
        self._sent = 0

    def push(self, token_ids: list[int]) -> str:
        """Feed new ids; return the text they completed (may be empty)."""
        kept = [t for t in token_ids if t not in self._skip] if self._skip else token_ids
        if not kept:
            return ""
        self._ids += kept
        text = self._stream.step(self._tokenizer, kept) or ""
        self._held = not text
        self._chars += len(text)
        return self._cleaned(text, final=False) if self._clean_up else text

    def finish(self) -> str:
        """The text still held back when the sequence ends."""
        tail = ""
        if self._held:
            whole = self._tokenizer.decode(self._ids, skip_special_tokens=False)
            tail = whole[self._chars:]
            self._chars = len(whole)
            self._held = False
        return self._cleaned(tail, final=True) if self._clean_up else tail

    def _cleaned(self, text: str, *, final: bool) -> str:
        """Clean-up applied to a stream: the whole text is cleaned again each time and only
        what lies far enough from its end to be settled is sent (a replacement looks at most
        a few characters ahead)."""
        self._raw += text
        cleaned = clean_up_tokenization(self._raw)
        upto = len(cleaned) if final else max(self._sent, len(cleaned) - _CLEAN_UP_REACH)
        out, self._sent = cleaned[self._sent:upto], upto
        return out
