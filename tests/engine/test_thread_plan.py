"""The engine's CPU threads follow the step: every core for a burst of prompts, one left to
the frontend while decoding; a hand-set count is never changed."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from izh_trio.engine.core import EngineCore, ThreadPlan
from izh_trio.wire import AddRequest, EngineConfig, SamplingParams


def _core(model_dir: Path, **cfg: object) -> EngineCore:
    return EngineCore(EngineConfig(model_dir=str(model_dir), num_kv_blocks=64, **cfg))


def _burst(core: EngineCore, n: int, prompt_len: int) -> None:
    for i in range(n):
        core.add_request(AddRequest(f"r{i}", [(7 * i + j) % 1900 + 50 for j in range(prompt_len)],
                                    SamplingParams(max_tokens=3, ignore_eos=True)))


def test_a_prompt_burst_takes_every_core_and_decoding_leaves_one(hf_dir: Path) -> None:
    before = torch.get_num_threads()
    try:
        core = _core(hf_dir, device="cpu")
        cores = os.cpu_count() or 2
        assert core.threads == ThreadPlan(decode=max(1, cores - 1), prefill=cores)
        _burst(core, 8, 40)  # 320 prompt tokens in the first step
        core.step()
        assert torch.get_num_threads() == core.threads.prefill
        core.step()  # decode only
        assert torch.get_num_threads() == core.threads.decode
        late = AddRequest("late", [60, 61, 62], SamplingParams(max_tokens=2))
        core.add_request(late)  # a short prompt beside decodes stays on decode threads
        core.step()
        assert torch.get_num_threads() == core.threads.decode
    finally:
        torch.set_num_threads(before)


def test_hand_set_threads_are_kept(hf_dir: Path) -> None:
    before = torch.get_num_threads()
    try:
        core = _core(hf_dir, device="cpu", num_threads=1)
        assert core.threads == ThreadPlan(decode=1, prefill=1)
        _burst(core, 8, 40)
        while core.has_work:
            core.step()
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
