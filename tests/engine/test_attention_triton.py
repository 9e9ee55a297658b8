"""The triton attention backend against the torch one: one mixed step, then the real model.

Without CUDA the kernels run in Triton's interpreter (``conftest.py`` sets it up), so shapes
stay small; on a GPU the same tests run the compiled kernels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from izh_trio.engine import cpu_attention
from izh_trio.engine.attention import (
    TORCH_BACKEND,
    ChunkSpec,
    StepAttention,
    cpu_kernel,
    get_backend,
)
from izh_trio.engine.block_manager import BlockManager
from izh_trio.engine.core import EngineCore
from izh_trio.engine.cuda_graphs import DecodeGraphs, capture_sizes
from izh_trio.engine.model_runner import ModelRunner
from izh_trio.engine.scheduler import ScheduledSeq
from izh_trio.engine.sequence import Sequence
from izh_trio.wire import AddRequest, EngineConfig, SamplingParams

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_backend_selection() -> None:
    cpu, cuda, fp32 = torch.device("cpu"), torch.device("cuda"), torch.float32
    assert get_backend("auto", cpu, torch.float64) is TORCH_BACKEND  # no kernel reads it
    assert get_backend("torch", cuda, fp32) is TORCH_BACKEND
    assert get_backend("auto", cuda, fp32).name == "triton"
    assert get_backend("triton", cpu, fp32).name == "triton"
    # fp32, bf16 and fp16 on CPU: the compiled kernel where it builds, else plain torch
    for dtype in (fp32, torch.bfloat16, torch.float16):
        assert get_backend("auto", cpu, dtype).name == (
            "cpu" if cpu_kernel.available() and cpu_attention.serves(dtype) else "torch")
    with pytest.raises(ValueError, match="unknown attention backend"):
        get_backend("flash", cpu, fp32)
    with pytest.raises(ValueError, match="attention_backend"):
        EngineConfig(model_dir="x", attention_backend="flash")
    with pytest.raises(ValueError, match="cuda_graphs"):
        EngineConfig(model_dir="x", cuda_graphs="maybe")
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(model_dir="x", gpu_memory_utilization=1.5)


def test_mixed_step_matches_torch_backend() -> None:
    """Fresh prompt, prefix hit, one-token chunk and decodes in one step, same caches."""
    triton_backend = get_backend("triton", DEVICE, torch.float32)
    g = torch.Generator().manual_seed(0)
    bs, h_q, h_kv, d, num_blocks = 4, 4, 2, 32, 40
    # (query_len, context_len); query_len 1 past the prefills are the decodes.
    prefills, decodes = [(6, 6), (3, 17), (2, 9)], [(1, 1), (1, 22), (1, 12)]
    perm = torch.randperm(num_blocks, generator=g).tolist()
    chunks, slots, start = [], [], 0
    for n, ctx in prefills + decodes:
        table, perm = perm[: -(-ctx // bs)], perm[-(-ctx // bs) :]
        chunks.append(ChunkSpec(start, n, ctx, table))
        slots += [table[p // bs] * bs + p % bs for p in range(ctx - n, ctx)]
        start += n
    step = StepAttention(slots=slots, prefills=chunks[:3], decodes=chunks[3:], block_size=bs)
    t = start
    cache = torch.randn(num_blocks, bs, h_kv, d, generator=g).to(DEVICE)
    q = torch.randn(t, h_q, d, generator=g).to(DEVICE)
    k = torch.randn(t, h_kv, d, generator=g).to(DEVICE)
    v = torch.randn(t, h_kv, d, generator=g).to(DEVICE)
    outs = []
    for backend in (TORCH_BACKEND, triton_backend):
        k_cache, v_cache = cache.clone(), cache.clone() * 0.5
        meta = backend.build_metadata(step, DEVICE, h_kv)
        meta.store_kv(k, v, k_cache, v_cache)
        outs.append((meta.paged_attention(q, k, v, k_cache, v_cache, d**-0.5),
                     k_cache, v_cache))
    (want, wk, wv), (got, gk, gv) = outs
    assert torch.equal(wk, gk) and torch.equal(wv, gv)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def _seq(rid: str, ids: list[int]) -> Sequence:
    return Sequence(request_id=rid, token_ids=list(ids), params=SamplingParams(),
                    stop_token_ids=frozenset())


def _logits_of_steps(tiny_dir: Path, backend: str, graphs: str = "off"
                     ) -> list[torch.Tensor]:
    """``graphs="eager"``: decode steps go through ``DecodeGraphs``' static, padded buffers,
    run without capture (what a CUDA graph replays, checkable on the CPU)."""
    runner = ModelRunner(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=16, block_size=4,
                                      attention_backend=backend, dtype="float32",
                                      device=str(DEVICE), cuda_graphs=graphs if graphs == "on"
                                      else "off"))
    assert (runner.attention.name == "triton") == (backend == "triton")
    if graphs == "eager":
        runner.graphs = DecodeGraphs(
            lambda ids, pos, meta: runner.model(ids, pos, meta, runner.kv_caches),
            max_batch=8, max_blocks_per_seq=runner.max_model_len // 4,
            max_context=runner.max_model_len, num_kv_heads=2, device=DEVICE, capture=False)
    bm = BlockManager(runner.num_blocks, 4, enable_prefix_caching=False)
    a = _seq("a", [11, 400, 7, 1500, 33, 2, 901, 45])
    b = _seq("b", [1800, 5, 77, 64, 3, 1000, 250])
    c = _seq("c", [1200, 6])
    logits = []

    def step(plan: list[tuple[Sequence, int]]) -> None:
        items = []
        for seq, n in plan:
            assert bm.allocate_slots(seq, n)
            items.append(ScheduledSeq(seq, n))
        out = runner.execute(items)
        logits.append(out.sample.cpu())
        for item, row in zip(out.sampling, out.sample, strict=True):
            item.seq.token_ids.append(int(row.argmax()))
        for item in items:
            item.seq.num_computed_tokens += item.num_new_tokens

    step([(a, 8), (b, 3)])  # a whole 8-token prefill; b's first chunk (no logits)
    step([(b, 4), (a, 1), (c, 2)])  # b's second chunk over its cached first, a's decode
    step([(a, 1), (b, 1), (c, 1)])  # pure decode: 3 rows (a graph of 4, one padding row)
    step([(a, 1), (b, 1), (c, 1)])
    return logits


def test_model_logits_match_torch_backend(tiny_dir: Path) -> None:
    """The tiny checkpoint in fp32, prefill + chunked prefill + decodes: same logits (1e-4)."""
    want = _logits_of_steps(tiny_dir, "torch")
    got = _logits_of_steps(tiny_dir, "triton")
    assert [t.shape[0] for t in got] == [1, 3, 3, 3]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0)


@pytest.mark.parametrize("graphs", ["eager", "on"])
def test_decode_graph_buffers_match_torch_backend(tiny_dir: Path, graphs: str) -> None:
    """Decode steps through the graph runner's padded static buffers: same logits."""
    if graphs == "on" and DEVICE.type != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    want = _logits_of_steps(tiny_dir, "torch")
    got = _logits_of_steps(tiny_dir, "triton", graphs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0)


def test_capture_sizes() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(256)[-3:] == [240, 248, 256]


def test_cuda_graphs_on_needs_cuda_and_triton(tiny_dir: Path) -> None:
    if DEVICE.type == "cuda":
        pytest.skip("this checks the refusal on the CPU")
    with pytest.raises(ValueError, match="cuda_graphs='on'"):
        ModelRunner(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=4, cuda_graphs="on"))


def _generate(tiny_dir: Path, backend: str) -> tuple[list[list[int]], int]:
    core = EngineCore(EngineConfig(model_dir=str(tiny_dir), attention_backend=backend,
                                   device=str(DEVICE), block_size=4, num_kv_blocks=20,
                                   max_num_batched_tokens=16))
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    shared = [5, 900, 17, 260, 1400, 8, 33, 71]  # two full blocks: prefix-cache hits
    prompts = [[*shared, 100, 200, 300], [*shared, 7], [1500, 2, 99, 4, 1000], shared * 2]
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    pending = list(enumerate(prompts))
    while pending or core.has_work:
        if pending:  # staggered arrivals: later prompts hit the cached prefix
            i, ids = pending.pop(0)
            assert core.add_request(AddRequest(f"r{i}", ids, params)) is None
        for o in core.step():
            got[o.request_id] += o.new_token_ids
    assert all(len(out) == 6 for out in got.values())
    return [got[f"r{i}"] for i in range(len(prompts))], core.block_manager.prefix_hits


def test_engine_greedy_tokens_match_torch_backend(tiny_dir: Path) -> None:
    """Whole engine, chunked prefill and prefix-cache hits: the same greedy tokens."""
    want, want_hits = _generate(tiny_dir, "torch")
    got, hits = _generate(tiny_dir, "triton")
    assert hits == want_hits > 0
    assert got == want
