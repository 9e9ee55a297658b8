"""Guided decoding: each constrained request's llguidance matcher, applied as a token mask.

Every step, one batched call computes the allowed-token bitmask of every constrained row
(llguidance's executor spreads the rows over threads); disallowed logits become -inf before
any other processing, so greedy and sampled rows alike can only pick grammar-valid tokens.
When a grammar is complete, the request stops, even if no eos token follows.
"""

from __future__ import annotations

from pathlib import Path

import llguidance
import torch
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask_par

from izh_trio.engine.sequence import Sequence

_BITS = torch.arange(32, dtype=torch.int32)


class GuidedDecoding:
    def __init__(self, tokenizer_path: Path, vocab_size: int, eos_token_ids: tuple[int, ...]
                 ) -> None:
        self._tokenizer_path = tokenizer_path
        self._vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._executor = llguidance.LLExecutor()
        self._matchers: dict[str, llguidance.LLMatcher] = {}

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
        out = logits.clone()
        index = torch.tensor(rows, device=logits.device)
        out[index] = out[index].masked_fill(~allowed, float("-inf"))
        return out

    def accept(self, request_id: str, token: int) -> bool:
        """Advance the request's matcher; True once its grammar is complete."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return False
        matcher.consume_token(token)
        return matcher.is_stopped() or matcher.is_error()

