"""Guided decoding: each constrained request's llguidance matcher, applied as a token mask.

Every step, one batched call computes the allowed-token bitmask of every constrained row
(llguidance's executor spreads the rows over threads); disallowed logits become -inf before
any other processing, so greedy and sampled rows alike can only pick grammar-valid tokens.
When a grammar is complete, the request stops, even if no eos token follows.

A grammar bounds what an output may be, not how long it runs: a free-form JSON string or a
schema's required properties can outlast ``max_tokens``. So every constrained request also
keeps a plan: the shortest token path that ends its output from where it is
(``grammar_closer``). A request whose plan is longer than its whole budget is refused at
once; near the end of the budget, a sampled token after which the output could no longer
end in the tokens left is replaced by the plan's next token. The output is free until the
last moment it can afford, and always ends validly within ``max_tokens``.
"""

from __future__ import annotations

from pathlib import Path

import llguidance
import torch
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask_par

from izh_trio.engine.grammar_closer import GrammarCloser
from izh_trio.engine.sequence import Sequence

_BITS = torch.arange(32, dtype=torch.int32)
#: How far ahead of its plan's length a request's tokens are checked: one token would have
#: to add more than this to the shortest ending to slip through.
_CHECK_MARGIN = 32
#: Away from its budget's end, a request that left its plan has the plan worked out again
#: every this many tokens (to know when its budget's end draws near).
_REFRESH = 8


class ConstraintBroken(Exception):
    """A request's matcher failed mid-output: its constraint can no longer be enforced."""


def _short(error: str) -> str:
    """The library's message, its first line: what follows is its parser's state dump (or a
    native backtrace), internals a client has no use for."""
    return error.strip().split("\n", 1)[0][:300]


class GuidedDecoding:
    def __init__(self, tokenizer_path: Path, vocab_size: int, eos_token_ids: tuple[int, ...],
                 limits: llguidance.LLParserLimits | None = None) -> None:
        """``limits``: the grammar library's bounds on work per step and on a grammar's size
        (its defaults when None: ~15 ms of lexer work and 50,000 parser items a step)."""
        self._tokenizer_path = tokenizer_path
        self._limits = limits
        self._vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._closer: GrammarCloser | None = None
        self._executor = llguidance.LLExecutor()
        self._matchers: dict[str, llguidance.LLMatcher] = {}
        #: Each request's shortest ending from its matcher's state (None: worked out again
        #: when it matters), and that ending's length when it was last known.
        self._plans: dict[str, list[int] | None] = {}
        self._need: dict[str, int] = {}
        #: Plans worked out for a sampled token before ``accept`` consumed it.
        self._staged: dict[str, tuple[int, list[int] | None]] = {}
        #: This step's masks (CPU, bool per token), by request.
        self._allowed: dict[str, torch.Tensor] = {}

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:  # built on first use: servers that never guide pay nothing
            self._tokenizer = llguidance.LLTokenizer(
                self._tokenizer_path.read_text(), n_vocab=self._vocab_size,
                eos_token=self._eos or None)
        return self._tokenizer

    @property
    def closer(self) -> GrammarCloser:
        if self._closer is None:
            self._closer = GrammarCloser(self.tokenizer, self._vocab_size)
        return self._closer

    def add(self, request_id: str, grammar: str, max_tokens: int) -> str | None:
        """Compile the request's grammar; returns the error instead of raising. A grammar
        whose shortest output does not fit in ``max_tokens`` is an error too."""
        try:
            # log_level 0: its errors are reported here, not printed on the engine's stderr
            matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0,
                                           limits=self._limits)
        except (ValueError, RuntimeError) as exc:
            return f"invalid grammar: {exc}"
        if matcher.is_error():
            return f"invalid grammar: {_short(matcher.get_error())}"
        plan = self.closer.path(matcher)
        if matcher.is_error():  # a limit hit while looking for the shortest ending
            return f"the output constraint cannot be enforced: {_short(matcher.get_error())}"
        if plan is not None and len(plan) > max_tokens:
            return (f"max_tokens={max_tokens} is too small for the output constraint: its "
                    f"shortest valid output takes {len(plan)} tokens")
        self._matchers[request_id] = matcher
        if plan is not None:  # else it never steers: no ending is known to aim for
            self._plans[request_id] = plan
            self._need[request_id] = len(plan)
        return None

    def forget(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)
        self._plans.pop(request_id, None)
        self._need.pop(request_id, None)
        self._staged.pop(request_id, None)

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
        self._allowed = {seqs[i].request_id: allowed[j] for j, i in enumerate(rows)}
        out = logits.clone()
        index = torch.tensor(rows, device=logits.device)
        out[index] = out[index].masked_fill(~allowed.to(logits.device), float("-inf"))
        return out

    def keep_closable(self, tokens: list[int], seqs: list[Sequence]) -> bool:
        """Replace each sampled token after which its output could no longer end within
        ``max_tokens`` by its plan's next token; True if any was replaced."""
        replaced = False
        if not self._need:  # the common case: no constrained request to watch
            return replaced
        for i, seq in enumerate(seqs):
            rid = seq.request_id
            need = self._need.get(rid)
            if need is None:
                continue
            left = seq.params.max_tokens - seq.num_output_tokens  # this step's token included
            plan = self._plans.get(rid)
            if left > need + _CHECK_MARGIN and (plan is not None
                                                or seq.num_output_tokens % _REFRESH):
                continue
            matcher = self._matchers[rid]
            if plan is None:
                plan = self._plans[rid] = self.closer.path(matcher)
                if plan is None:
                    continue
                self._need[rid] = len(plan)
                if left > len(plan) + _CHECK_MARGIN:
                    continue
            token = tokens[i]
            if plan and token == plan[0]:
                continue  # on plan: what it needs shrinks with the budget
            after = self._plan_after(matcher, token, plan, left - 1)
            if after is not None and len(after) <= left - 1:
                self._staged[rid] = (token, after)
                continue
            allowed = self._allowed.get(rid)
            if plan and allowed is not None and not bool(allowed[plan[0]]):
                # A plan kept from an earlier state, tokenized otherwise than the mask wants
                plan = self._plans[rid] = self.closer.path(matcher)
            if plan:
                tokens[i] = plan[0]
                replaced = True
        return replaced

    def _plan_after(self, matcher: llguidance.LLMatcher, token: int, plan: list[int],
                    budget: int) -> list[int] | None:
        """The shortest ending once ``token`` is taken, or None if none is known (the
        matcher is left as it was): the current plan when it still ends the output from
        there with a token to spare in ``budget`` (checked cheaply, the common case inside a
        free string), else a new one, cut into tokens exactly as the mask will want them."""
        if token in self._eos:
            return []  # the mask let it through: the output ends here
        if matcher.try_consume_tokens([token]) != 1:
            return None
        try:
            if matcher.is_stopped():
                return []
            still = self._still_ending(matcher, plan)
            if still is not None and len(still) < budget:
                return still
            return self.closer.path(matcher)
        finally:
            matcher.rollback(1)

    def _still_ending(self, matcher: llguidance.LLMatcher, plan: list[int]) -> list[int] | None:
        """``plan`` (its eos fitted to where it now ends) if it still ends the output."""
        body = plan[:-1] if plan and plan[-1] in self._eos else plan
        if not body:
            return None
        consumed = matcher.try_consume_tokens(body)
        try:
            if consumed != len(body) or not matcher.is_accepting():
                return None
            return body if matcher.is_stopped() else [*body, self.closer.eos]
        finally:
            if consumed:
                matcher.rollback(consumed)

    def accept(self, request_id: str, token: int) -> bool:
        """Advance the request's matcher; True once its grammar is complete. Raises
        :class:`ConstraintBroken` if the matcher fails (a limit of the grammar library hit
        mid-output): the output could no longer be held to its constraint."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return False
        if matcher.is_error():  # failed computing this step's mask: only eos was left open
            raise ConstraintBroken(_short(matcher.get_error()))
        plan = self._plans.get(request_id)
        staged = self._staged.pop(request_id, None)
        if staged is not None and staged[0] == token:
            plan = staged[1]
        elif plan and plan[0] == token:
            plan = plan[1:]
        else:
            plan = None  # the last known length stands in until it is worked out again
        if request_id in self._need:
            self._plans[request_id] = plan
            if plan is not None:
                self._need[request_id] = len(plan)
        matcher.consume_token(token)
        if matcher.is_error():
            raise ConstraintBroken(_short(matcher.get_error()))
        return matcher.is_stopped()
