"""Logits of the real engine at every position of a sequence, for comparing with transformers."""

from __future__ import annotations

import torch

from izh_trio.engine.block_manager import BlockManager
from izh_trio.engine.model_runner import ModelRunner
from izh_trio.engine.scheduler import ScheduledSeq
from izh_trio.engine.sequence import Sequence
from izh_trio.wire import SamplingParams


def every_position(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """Logits at every position: all but the last token prefilled (their logits scored as
    prompt logprobs are), the last decoded through the paged cache."""
    seq = Sequence(request_id="f", token_ids=list(ids), params=SamplingParams(prompt_logprobs=0),
                   stop_token_ids=frozenset())
    bm = BlockManager(runner.num_blocks, runner.block_size)
    assert bm.allocate_slots(seq, len(ids))
    prefill = runner.execute([ScheduledSeq(seq, len(ids) - 1)])
    seq.num_computed_tokens = len(ids) - 1
    last = runner.execute([ScheduledSeq(seq, 1)]).sample[0]
    return torch.cat([prefill.prompt[seq].float(), last[None].float()])
