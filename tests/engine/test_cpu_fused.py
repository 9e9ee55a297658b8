"""The fused CPU elementwise kernels against the torch ops of the model they replace.

The references are the model's own modules and functions (``qwen3.RMSNorm``, ``apply_rope``,
``attention.torch_sdpa.store_kv``), so a change on either side shows here. The kernels round every
product as torch does; only the order of a norm's sum of squares differs, hence the tight
tolerance. The whole model on the kernels is checked against transformers by
``test_qwen3_vs_transformers.py``; here it is checked against the engine's own torch path.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from izh_trio.engine import cpu_fused
from izh_trio.engine.attention import TORCH_BACKEND, StepAttention
from izh_trio.engine.attention.torch_sdpa import store_kv
from izh_trio.engine.loader import ModelConfig
from izh_trio.engine.models.layers import CpuRMSNorm, RMSNorm, RotaryEmbedding, apply_rope
from izh_trio.engine.models.qwen3 import Qwen3ForCausalLM

pytestmark = pytest.mark.skipif(not cpu_fused.available(),
                                reason="no C compiler: the engine uses the torch ops")

RTOL, ATOL = 1e-6, 1e-6  # a few ulp on unit-scale values
EPS = 1e-6
#: In bf16 a different sum of squares may round a value to its neighbour (one bf16 ulp, 2^-8
#: relative); nearly every value must be the very one torch's bf16 ops give. fp16 likewise
#: (its ulp 2^-11).
BF16_RTOL, BF16_SAME = 2**-7, 0.98
HALF_RTOL = {torch.bfloat16: BF16_RTOL, torch.float16: 2**-10}
needs_f16 = pytest.mark.skipif(not cpu_fused.serves(torch.float16),
                               reason="this compiler has no _Float16: no fp16 kernels")
HALF = [torch.bfloat16, pytest.param(torch.float16, marks=needs_f16)]


@pytest.fixture(params=[torch.float32, *HALF], ids=["fp32", "bf16", "fp16"])
def dtype(request: pytest.FixtureRequest) -> torch.dtype:
    return request.param


def _norm(dim: int, g: torch.Generator, dtype: torch.dtype = torch.float32) -> RMSNorm:
    norm = RMSNorm(dim, EPS)
    norm.weight.data = torch.randn(dim, generator=g)  # not ones: the weight must be applied
    return norm.to(dtype)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    want = want.detach()
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
        return
    tol = HALF_RTOL[got.dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    same = (got == want).float().mean().item()
    assert same >= BF16_SAME, f"only {same:.1%} of the values are torch's own"


@pytest.mark.parametrize("tokens", [1, 3, 32, 257])
@pytest.mark.parametrize("dim", [256, 100, 1024])
def test_rms_norm(tokens: int, dim: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(tokens * dim)
    norm = _norm(dim, g, dtype)
    x = (torch.randn(tokens, dim, generator=g) * 3).to(dtype)
    _close(cpu_fused.rms_norm(x, norm.weight, EPS), norm(x))


@pytest.mark.parametrize("tokens", [1, 3, 257])
@pytest.mark.parametrize("inter", [3072, 100, 1])
def test_silu_mul(tokens: int, inter: int, dtype: torch.dtype) -> None:
    """SiLU's e^x is ours, not SLEEF's: fp32 within a few ulp; bf16 torch's own values."""
    g = torch.Generator().manual_seed(tokens * inter)
    gate_up = (torch.randn(tokens, 2 * inter, generator=g) * 4).to(dtype)
    gate_up[0, : min(inter, 6)] = torch.tensor([0.0, -0.0, 100.0, -100.0, 1e-30, -87.9])[:inter]
    gate, up = gate_up.chunk(2, dim=-1)
    _close(cpu_fused.silu_mul(gate_up), F.silu(gate) * up)


@pytest.mark.parametrize("tokens", [1, 3, 32, 257])
@pytest.mark.parametrize("dim", [256, 100])
def test_add_rms_norm(tokens: int, dim: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(tokens + dim)
    norm = _norm(dim, g, dtype)
    x = torch.randn(tokens, dim, generator=g).to(dtype)
    residual = torch.randn(tokens, dim, generator=g).to(dtype)
    h, normed = cpu_fused.add_rms_norm(x, residual, norm.weight, EPS)
    assert torch.equal(h, residual + x)  # one rounding either way
    _close(normed, norm(residual + x))


def _qk_case(tokens: int, h_q: int, h_kv: int, d: int, block_size: int = 16,
             dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(tokens * 1000 + h_q * 100 + d)
    qkv = (torch.randn(tokens, (h_q + 2 * h_kv) * d, generator=g) * 2).to(dtype)
    # Positions far apart, so each token's cos/sin row differs.
    positions = torch.randint(0, 8192, (tokens,), generator=g)
    cos, sin = RotaryEmbedding(d, 1e6, 8192).table(positions, dtype)
    blocks = tokens // block_size + 5
    k_cache = torch.randn(blocks, block_size, h_kv, d, generator=g).to(dtype)
    v_cache = torch.randn(blocks, block_size, h_kv, d, generator=g).to(dtype)
    slots = torch.randperm(blocks * block_size, generator=g)[:tokens]  # anywhere in the cache
    return qkv, cos, sin, k_cache, v_cache, slots


@pytest.mark.parametrize("tokens", [1, 2, 7, 32, 130])
@pytest.mark.parametrize(("h_q", "h_kv"), [(4, 2), (8, 2), (2, 2)])
@pytest.mark.parametrize("d", [64, 128, 32, 80])
def test_qk_norm_rope_store(tokens: int, h_q: int, h_kv: int, d: int,
                            dtype: torch.dtype) -> None:
    """Head dims of 64 and 128 run the kernel's specialised copies, 32 and 80 the general
    one; the untouched slots of the caches must stay as they were."""
    qkv, cos, sin, k_cache, v_cache, slots = _qk_case(tokens, h_q, h_kv, d, dtype=dtype)
    g = torch.Generator().manual_seed(d)
    q_norm, k_norm = _norm(d, g, dtype), _norm(d, g, dtype)
    want_k_cache, want_v_cache = k_cache.clone(), v_cache.clone()
    q_ref, k_ref, v_ref = qkv.split([h_q * d, h_kv * d, h_kv * d], dim=-1)
    q_ref = apply_rope(q_norm(q_ref.view(tokens, h_q, d)), (cos, sin))
    k_ref = apply_rope(k_norm(k_ref.view(tokens, h_kv, d)), (cos, sin))
    v_ref = v_ref.view(tokens, h_kv, d)
    store_kv(k_ref.detach(), v_ref, want_k_cache, want_v_cache, slots)

    q, k, v = cpu_fused.qk_norm_rope_store(qkv, h_q, h_kv, q_norm.weight, k_norm.weight, EPS,
                                           cos, sin, k_cache, v_cache, slots)
    _close(q, q_ref)
    _close(k, k_ref)
    assert torch.equal(v, v_ref) and q.is_contiguous() and k.is_contiguous()
    _close(k_cache, want_k_cache)
    assert torch.equal(k_cache.view(-1, h_kv, d)[slots], k)  # stored is what it returns
    assert torch.equal(v_cache, want_v_cache)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("d", [64, 128, 32])
def test_rope_store_without_norms_is_llamas(d: int, dtype: torch.dtype) -> None:
    """No norm weights (Llama's heads): q and k only rotated, bit for bit torch's RoPE in
    either dtype, and k, v stored."""
    tokens, h_q, h_kv = 7, 4, 2
    qkv, cos, sin, k_cache, v_cache, slots = _qk_case(tokens, h_q, h_kv, d, dtype=dtype)
    want_k_cache, want_v_cache = k_cache.clone(), v_cache.clone()
    q_ref, k_ref, v_ref = qkv.split([h_q * d, h_kv * d, h_kv * d], dim=-1)
    q_ref = apply_rope(q_ref.reshape(tokens, h_q, d), (cos, sin))
    k_ref = apply_rope(k_ref.reshape(tokens, h_kv, d), (cos, sin))
    store_kv(k_ref, v_ref.reshape(tokens, h_kv, d), want_k_cache, want_v_cache, slots)
    q, k, v = cpu_fused.qk_norm_rope_store(qkv, h_q, h_kv, None, None, 0.0, cos, sin, k_cache,
                                           v_cache, slots)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    assert torch.equal(v, v_ref.reshape(tokens, h_kv, d))
    assert torch.equal(k_cache, want_k_cache) and torch.equal(v_cache, want_v_cache)


def test_slot_outside_the_cache_raises() -> None:
    qkv, cos, sin, k_cache, v_cache, slots = _qk_case(4, 4, 2, 64)
    w = torch.ones(64)
    for bad in (-1, k_cache.shape[0] * k_cache.shape[1]):
        slots[2] = bad
        with pytest.raises(IndexError, match="1 of 4 KV slots"):
            cpu_fused.qk_norm_rope_store(qkv, 4, 2, w, w, EPS, cos, sin, k_cache, v_cache, slots)


@pytest.fixture
def threads() -> Iterator[None]:
    """Leaves torch's thread count as it found it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("threads")
def test_many_rows_split_between_threads_give_one_threads_results(dtype: torch.dtype) -> None:
    """A prefill's rows (past ``PARALLEL_MIN_VALUES``) are split between torch's threads;
    every kernel's results, and the count of slots outside the cache, are bitwise those of
    one thread, whatever the count, and from the same rows as a decode-sized call's."""
    tokens, dim, inter, h_q, h_kv, d = 300, 1024, 512, 8, 2, 64
    assert tokens * dim >= cpu_fused.PARALLEL_MIN_VALUES > 4 * 2 * inter
    g = torch.Generator().manual_seed(7)
    x, res = (torch.randn(tokens, dim, generator=g).to(dtype) for _ in range(2))
    w = torch.randn(dim, generator=g).to(dtype)
    gate_up = torch.randn(tokens, 2 * inter, generator=g).to(dtype)
    qkv, cos, sin, k_cache, v_cache, slots = _qk_case(tokens, h_q, h_kv, d, dtype=dtype)
    hw = torch.randn(d, generator=g).to(dtype)
    assert tokens * qkv.shape[1] >= cpu_fused.PARALLEL_MIN_VALUES

    def run() -> list[torch.Tensor]:
        kc, vc = k_cache.clone(), v_cache.clone()
        qk = cpu_fused.qk_norm_rope_store(qkv, h_q, h_kv, hw, hw, EPS, cos, sin, kc, vc, slots)
        return [cpu_fused.rms_norm(x, w, EPS), *cpu_fused.add_rms_norm(x, res, w, EPS),
                cpu_fused.silu_mul(gate_up), *qk, kc, vc]

    results = []
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        results.append(run())
    for got in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(got, results[0], strict=True))
    # the first rows alone, below the split, come out the same
    assert torch.equal(cpu_fused.silu_mul(gate_up[:4]), results[0][3][:4])
    assert torch.equal(cpu_fused.add_rms_norm(x[:4], res[:4], w, EPS)[1], results[0][2][:4])
    bad = slots.clone()
    bad[[5, 150, 299]] = -1
    with pytest.raises(IndexError, match="3 of 300 KV slots"):
        cpu_fused.qk_norm_rope_store(qkv, h_q, h_kv, hw, hw, EPS, cos, sin, k_cache.clone(),
                                     v_cache.clone(), bad)


@pytest.mark.parametrize("why", ["no library", "float64"])
def test_falls_back_to_torch(why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the library, or for other dtypes, the model keeps its own torch ops (the one
    torch path: the wrappers have none) and gives the kernels' results; the wrappers refuse
    what they cannot run rather than compute it some other way."""
    qkv, cos, sin, k_cache, v_cache, slots = _qk_case(5, 4, 2, 64)
    g = torch.Generator().manual_seed(1)
    w, x, res = torch.randn(64, generator=g), torch.randn(5, 64, generator=g), torch.randn(5, 64)
    want_norm, want_add = cpu_fused.rms_norm(x, w, EPS), cpu_fused.add_rms_norm(x, res, w, EPS)
    want_qk = cpu_fused.qk_norm_rope_store(qkv, 4, 2, w, w, EPS, cos, sin, k_cache.clone(),
                                           v_cache.clone(), slots)
    if why == "no library":
        monkeypatch.setattr(cpu_fused._KERNEL, "_lib", False)
    dtype = torch.float64 if why == "float64" else torch.float32

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype)

    cfg = ModelConfig(vocab_size=16, hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      rms_norm_eps=EPS, rope_theta=1e6, max_position_embeddings=64,
                      tie_word_embeddings=False, attention_bias=False, eos_token_ids=(),
                      dtype=dtype, architecture="Qwen3ForCausalLM")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = Qwen3ForCausalLM(cfg, max_positions=64)
    finally:
        torch.set_default_dtype(previous)
    assert model.use_cpu_twins(TORCH_BACKEND) == 0
    layer = model.layers[0]
    norm = layer.post_attention_layernorm
    norm.weight.data = cast(w)
    attn = layer.self_attn
    attn.q_norm.weight.data, attn.k_norm.weight.data = cast(w), cast(w)
    meta = TORCH_BACKEND.build_metadata(StepAttention(slots.tolist(), [], [], k_cache.shape[1]),
                                        torch.device("cpu"), 2)
    got_qk = attn.rope_store(cast(qkv), (cast(cos), cast(sin)),
                                  (cast(k_cache), cast(v_cache)), meta)
    for got, want in [(norm(cast(x)), want_norm),
                      *zip(norm.add(cast(x), cast(res)), want_add, strict=True),
                      *zip(got_qk, want_qk, strict=True)]:
        torch.testing.assert_close(got.float(), want, rtol=RTOL, atol=ATOL)
    with pytest.raises(AssertionError):
        cpu_fused.rms_norm(cast(x), cast(w), EPS)


def test_engine_logits_same_with_and_without_kernels(tiny_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill then decode steps of the whole engine, on the kernels and on torch's ops."""
    from izh_trio.engine.core import EngineCore
    from izh_trio.engine.model_runner import StepLogits
    from izh_trio.engine.scheduler import ScheduledSeq
    from izh_trio.wire import AddRequest, EngineConfig, SamplingParams

    def run() -> tuple[bool, list[torch.Tensor]]:
        core = EngineCore(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=64, block_size=4))
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        for i, ids in enumerate([[5, 77, 300, 12, 9], [1500, 3], list(range(40, 70))]):
            assert core.add_request(AddRequest(f"r{i}", ids, params)) is None
        logits: list[torch.Tensor] = []
        execute = core.runner.execute

        def recording(batch: list[ScheduledSeq]) -> StepLogits:
            out = execute(batch)
            logits.append(out.sample.clone())
            return out

        monkeypatch.setattr(core.runner, "execute", recording)
        while core.has_work:
            core.step()
        return any(isinstance(m, CpuRMSNorm) for m in core.runner.model.modules()), logits

    fused, with_kernels = run()
    assert fused
    monkeypatch.setattr(cpu_fused._KERNEL, "_lib", False)
    fused, with_torch = run()
    assert not fused and len(with_torch) == len(with_kernels)
    for a, b in zip(with_kernels, with_torch, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
