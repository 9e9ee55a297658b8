"""Guided decoding: each constrained request's llguidance matcher, applied as a token mask.

Every step, one batched call computes the allowed-token bitmask of every constrained row
(llguidance's executor spreads the rows over threads); disallowed logits become -inf before
any other processing, so greedy and sampled rows alike can only pick grammar-valid tokens.
When a grammar is complete, the request stops, even if no eos token follows.

A grammar bounds what an output may be, not how long it runs: a free-form JSON string can
outlast ``max_tokens``. For requests whose whole output is JSON, the last tokens are steered
(still inside the grammar's mask) along the shortest completion of what was written, so the
output closes within budget whenever the grammar allows that completion.
"""

from __future__ import annotations

from pathlib import Path

import llguidance
import torch
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask_par

from izh_trio.engine.json_closer import json_completion
from izh_trio.engine.sequence import Sequence

_BITS = torch.arange(32, dtype=torch.int32)
#: Tokens before max_tokens from which a JSON output's completion is checked each step.
_CLOSE_WINDOW = 64


class GuidedDecoding:
    def __init__(self, tokenizer_path: Path, vocab_size: int, eos_token_ids: tuple[int, ...]
                 ) -> None:
        self._tokenizer_path = tokenizer_path
        self._vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._executor = llguidance.LLExecutor()
        self._matchers: dict[str, llguidance.LLMatcher] = {}
        self._token_of_bytes: dict[bytes, int] | None = None

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:  # built on first use: servers that never guide pay nothing
            self._tokenizer = llguidance.LLTokenizer(
                self._tokenizer_path.read_text(), n_vocab=self._vocab_size,
                eos_token=self._eos or None)
        return self._tokenizer

    def add(self, request_id: str, grammar: str) -> str | None:
        """Compile the request's grammar; returns the error instead of raising."""
        try:
            matcher = llguidance.LLMatcher(self.tokenizer, grammar)
        except (ValueError, RuntimeError) as exc:
            return f"invalid grammar: {exc}"
        if matcher.is_error():
            return f"invalid grammar: {matcher.get_error()}"
        self._matchers[request_id] = matcher
        return None

    def forget(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._matchers

    def mask(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Set every grammar-forbidden logit to -inf (on a copy, when any row is guided)."""
        rows = [i for i, s in enumerate(seqs) if s.request_id in self._matchers]
        if not rows:
            return logits
        bitmask = allocate_token_bitmask(len(rows), self._vocab_size)
        fill_next_token_bitmask_par(
            self._executor,
            [(self._matchers[seqs[i].request_id], j) for j, i in enumerate(rows)],
            bitmask,
        )
        bits = torch.from_numpy(bitmask)  # [R, ceil(V / 32)] int32, bit k of word w = id 32w+k
        allowed = ((bits[:, :, None] >> _BITS) & 1).bool().flatten(1)[:, : logits.shape[-1]]
        allowed = allowed.to(logits.device)
        for j, i in enumerate(rows):
            forced = self._closing_token(seqs[i], allowed[j])
            if forced is not None:
                allowed[j] = False
                allowed[j, forced] = True
        out = logits.clone()
        index = torch.tensor(rows, device=logits.device)
        out[index] = out[index].masked_fill(~allowed, float("-inf"))
        return out

    def _closing_token(self, seq: Sequence, allowed: torch.Tensor) -> int | None:
        """In a JSON output's last tokens: the allowed token that best heads for its close."""
        params = seq.params
        left = params.max_tokens - seq.num_output_tokens
        if not params.json_output or left > _CLOSE_WINDOW:
            return None
        text = self.tokenizer.decode_str(seq.output_token_ids)
        completion = json_completion(text)
        if completion is None or left > len(completion) + 1:
            return None  # unreadable, or enough budget left to end freely
        if not completion:
            eos = [t for t in self._eos if bool(allowed[t])]
            return eos[0] if eos else None
        table = self._bytes_table()
        wanted = completion.encode()
        for k in range(len(wanted), 0, -1):  # the longest allowed token along the completion
            token = table.get(wanted[:k])
            if token is not None and bool(allowed[token]):
                return token
        return None

    def _bytes_table(self) -> dict[bytes, int]:
        if self._token_of_bytes is None:
            table: dict[bytes, int] = {}
            tok = self.tokenizer
            for token in range(tok.vocab_size):
                raw = tok.decode_bytes([token])
                if raw and not raw.startswith(b"\xff"):  # 0xff marks special tokens
                    table.setdefault(raw, token)
            self._token_of_bytes = table
        return self._token_of_bytes

    def accept(self, request_id: str, token: int) -> bool:
        """Advance the request's matcher; True once its grammar is complete."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return False
        matcher.consume_token(token)
        return matcher.is_stopped() or matcher.is_error()

