"""Log-probabilities as reported to clients: the model's raw distribution, like vLLM's default."""

from __future__ import annotations

import torch

from izh_trio.wire import TokenLogprobs


def token_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, k: int
                   ) -> list[TokenLogprobs]:
    """logprobs: [R, V] log-softmax rows; token_ids: [R] the token each row is asked about."""
    chosen = logprobs.gather(1, token_ids[:, None])  # [R, 1]
    ranks = (logprobs > chosen).sum(dim=1) + 1
    if k > 0:
        top_lp, top_ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        top_ids_l, top_lp_l = top_ids.tolist(), top_lp.tolist()
    else:
        top_ids_l = top_lp_l = [()] * len(token_ids)
    return [
        TokenLogprobs(token_id=t, logprob=lp, rank=r, top_ids=ti, top_logprobs=tl)
        for t, lp, r, ti, tl in zip(token_ids.tolist(), chosen[:, 0].tolist(), ranks.tolist(),
                                    top_ids_l, top_lp_l, strict=True)
    ]
