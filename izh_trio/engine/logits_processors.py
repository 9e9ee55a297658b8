"""What a request does to its logits before sampling: min_tokens, logit_bias, penalties.

Applied in vLLM's order, to every row that needs it, greedy rows included (a logit_bias or a
penalty changes the argmax too). Rows that need nothing are left untouched and cost nothing.
"""

from __future__ import annotations

import torch

from izh_trio.engine.sequence import Sequence


def process_logits(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """logits: [S, V] fp32, one row per sequence; returns a processed copy (or the input)."""
    vocab = logits.shape[-1]
    copied = False

    def writable() -> torch.Tensor:
        nonlocal logits, copied
        if not copied:
            logits, copied = logits.clone(), True
        return logits

    for i, seq in enumerate(seqs):
        p = seq.params
        if seq.num_output_tokens < p.min_tokens and seq.stop_token_ids:
            # Too early to stop: the stop tokens can't be sampled at all.
            writable()[i, [t for t in seq.stop_token_ids if t < vocab]] = float("-inf")
        if p.logit_bias:
            ids = torch.tensor([t for t, _ in p.logit_bias if t < vocab], dtype=torch.long,
                               device=logits.device)
            bias = torch.tensor([b for t, b in p.logit_bias if t < vocab], device=logits.device)
            writable()[i].index_add_(0, ids, bias)

    penalized = [i for i, s in enumerate(seqs) if s.params.penalized]
    if penalized:
        out = writable()
        dev = out.device
        rows = torch.tensor(penalized, device=dev)
        group = [seqs[i] for i in penalized]
        counts = _output_counts(group, vocab).to(dev)  # [P, V]
        rep = torch.tensor([s.params.repetition_penalty for s in group], device=dev)[:, None]
        if bool((rep != 1.0).any()):
            seen = counts > 0
            seen |= _prompt_mask(group, vocab).to(dev)
            x = out[rows]
            penalised = torch.where(x > 0, x / rep, x * rep)
            out[rows] = torch.where(seen, penalised, x)
        freq = torch.tensor([s.params.frequency_penalty for s in group], device=dev)[:, None]
        pres = torch.tensor([s.params.presence_penalty for s in group], device=dev)[:, None]
        out[rows] -= freq * counts + pres * (counts > 0).float()
    return logits


def _output_counts(seqs: list[Sequence], vocab: int) -> torch.Tensor:
    longest = max(s.num_output_tokens for s in seqs)
    # Pad with an extra column (index ``vocab``) that is dropped afterwards.
    ids = torch.full((len(seqs), max(longest, 1)), vocab, dtype=torch.long)
    for row, s in enumerate(seqs):
        if s.num_output_tokens:
            ids[row, : s.num_output_tokens] = torch.tensor(s.output_token_ids)
    counts = torch.zeros(len(seqs), vocab + 1)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))
    return counts[:, :vocab]


def _prompt_mask(seqs: list[Sequence], vocab: int) -> torch.Tensor:
    mask = torch.zeros(len(seqs), vocab, dtype=torch.bool)
    for row, s in enumerate(seqs):
        prompt = torch.tensor(s.token_ids[: s.num_prompt_tokens], dtype=torch.long)
        mask[row, prompt[prompt < vocab]] = True
    return mask
