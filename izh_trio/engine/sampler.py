"""Vectorised sampling over the step's batch.

Sampling is ``argmax(p / E)`` with ``E ~ Exp(1)`` per vocabulary entry (the exponential race,
equivalent to drawing from ``p``). A seeded request draws its ``E`` from its own generator,
advanced once per sampled token, so its samples do not depend on what else is in the batch.
"""

from __future__ import annotations

import attrs
import torch

from izh_trio.engine.cpu_argmax import argmax_rows
from izh_trio.engine.guided import GuidedDecoding
from izh_trio.engine.logits_processors import process_logits
from izh_trio.engine.logprobs import token_logprobs
from izh_trio.engine.sequence import Sequence
from izh_trio.engine.think_budget import force_think_end
from izh_trio.wire import TokenLogprobs


@attrs.frozen
class Sampled:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


class Sampler:
    def __init__(self, seed: int, guided: GuidedDecoding | None = None) -> None:
        self._seed = seed
        self._generator = torch.Generator().manual_seed(seed)
        self._device_generators: dict[torch.device, torch.Generator] = {}
        self._seeded: dict[str, torch.Generator] = {}
        self._guided = guided

    def forget(self, request_id: str) -> None:
        self._seeded.pop(request_id, None)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> Sampled:
        """logits: [S, V] fp32, one row per sequence in ``seqs``."""
        allowed = self._guided.mask(logits, seqs) if self._guided is not None else logits
        processed = process_logits(allowed, seqs)
        tokens = argmax_rows(processed)  # the compiled loop on CPU, torch's elsewhere
        random_rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if random_rows:
            tokens[random_rows] = self._sample_random(processed[random_rows],
                                                      [seqs[i] for i in random_rows])
        token_ids = tokens.tolist()
        # Tokens substituted here are reported with their logprobs under the step's logits.
        replaced = self._guided is not None and self._guided.keep_closable(token_ids, seqs)
        replaced |= force_think_end(token_ids, seqs)
        if replaced:
            tokens = torch.tensor(token_ids, device=tokens.device)
        return Sampled(token_ids, self._logprobs(logits, tokens, seqs))

    def _sample_random(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        params = [s.params for s in seqs]
        dev = logits.device
        scaled = logits / torch.tensor([p.temperature for p in params], device=dev)[:, None]
        probs = _filtered_probs(
            scaled,
            top_k=torch.tensor([p.top_k if p.top_k > 0 else scaled.shape[-1] for p in params],
                               device=dev),
            top_p=torch.tensor([p.top_p for p in params], device=dev),
            min_p=torch.tensor([p.min_p for p in params], device=dev),
        )
        noise = torch.empty_like(probs)
        unseeded = [j for j, p in enumerate(params) if p.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), probs.shape[-1], device=dev
                                          ).exponential_(generator=self._generator_on(dev))
        for j, seq in enumerate(seqs):
            if seq.params.seed is not None:
                gen = self._seeded.get(seq.request_id)
                if gen is None:
                    gen = torch.Generator().manual_seed(seq.params.seed)
                    self._seeded[seq.request_id] = gen
                # Drawn on the CPU from the request's own generator: the same on any device.
                noise[j] = torch.empty(probs.shape[-1]).exponential_(generator=gen)
        return (probs / noise).argmax(dim=-1)

    def _generator_on(self, device: torch.device) -> torch.Generator:
        """The shared generator for unseeded rows; on an accelerator, one seeded alike there."""
        if device.type == "cpu":
            return self._generator
        gen = self._device_generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device).manual_seed(self._seed)
            self._device_generators[device] = gen
        return gen

    @staticmethod
    def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, seqs: list[Sequence]
                  ) -> list[TokenLogprobs | None]:
        out: list[TokenLogprobs | None] = [None] * len(seqs)
        rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        if not rows:
            return out
        k = max(seqs[i].params.logprobs or 0 for i in rows)
        raw = logits[rows].log_softmax(dim=-1)
        for i, entry in zip(rows, token_logprobs(raw, tokens[rows], k), strict=True):
            want = seqs[i].params.logprobs or 0
            out[i] = attrs.evolve(entry, top_ids=entry.top_ids[:want],
                                  top_logprobs=entry.top_logprobs[:want])
        return out


def _filtered_probs(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Softmax restricted by top-k, then top-p (nucleus), then min-p; rows renormalised."""
    vocab = logits.shape[-1]
    if bool((top_k < vocab).any()) or bool((top_p < 1.0).any()):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device)[None, :]
        sorted_logits = sorted_logits.masked_fill(ranks >= top_k[:, None], float("-inf"))
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first always stays).
        before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_logits = sorted_logits.masked_fill(before >= top_p[:, None], float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    if bool((min_p > 0).any()):
        floor = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs
