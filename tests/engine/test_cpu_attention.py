"""The compiled CPU decode kernel against an fp64 reference on the same paged cache.

Both of the kernel's paths are checked where the machine can run them: the AVX-512 one
(what ``-march=native`` builds here, if the CPU has it) and the portable one (the same
source built for plain AVX2, or what a non-x86 compiler builds).
"""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from izh_trio.engine import cpu_attention

pytestmark = pytest.mark.skipif(not cpu_attention.available(),
                                reason="no C compiler: the engine uses the torch path")

TOLERANCE = 2e-5  # max abs error on unit-scale inputs


def _reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               tables: torch.Tensor, lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax attention in fp64, one sequence at a time; no context gives zeros."""
    b, h_q, d = q.shape
    bs, h_kv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(b, h_q, d, dtype=torch.float64)
    for i in range(b):
        n = int(lens[i])
        if n == 0:
            continue
        k = k_cache[tables[i]].reshape(-1, h_kv, d)[:n].double().repeat_interleave(h_q // h_kv, 1)
        v = v_cache[tables[i]].reshape(-1, h_kv, d)[:n].double().repeat_interleave(h_q // h_kv, 1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[i].double(), k) * scale, dim=-1)
        out[i] = torch.einsum("hn,nhd->hd", p, v)
    assert bs == v_cache.shape[1]
    return out


def _case(seed: int, block_size: int, h_q: int, h_kv: int, head_dim: int,
          lens: list[int], q_scale: float = 1.0
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    width = max(1, (max(lens) + block_size - 1) // block_size)
    num_blocks = len(lens) * width + 3
    k_cache = torch.randn(num_blocks, block_size, h_kv, head_dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, h_kv, head_dim, generator=g)
    # Blocks out of order, as after a while of serving; a shared block is fine too.
    tables = torch.randperm(num_blocks, generator=g)[: len(lens) * width].view(len(lens), width)
    tables[-1, 0] = tables[0, 0]
    q = torch.randn(len(lens), h_q, head_dim, generator=g) * q_scale
    return q, k_cache, v_cache, tables, torch.tensor(lens)


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
           lens: torch.Tensor, scale: float) -> None:
    got = cpu_attention.paged_decode(q, k_cache, v_cache, tables, lens, scale)
    assert got.shape == q.shape and got.dtype == torch.float32
    err = (got.double() - _reference(q, k_cache, v_cache, tables, lens, scale)).abs().max()
    assert err <= TOLERANCE, f"max abs error {err:.3g}"


def _lens(block_size: int) -> list[int]:
    return [1, 2, block_size - 1, block_size, block_size + 1, 3 * block_size - 1, 37, 5, 100]


@pytest.fixture(params=["native", "portable"])
def kernel_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Runs a test with the engine's build, then with the source built without AVX-512."""
    if request.param == "portable":
        monkeypatch.setattr(cpu_attention._KERNEL, "_lib", _portable_lib(tmp_path_factory))
    yield request.param


_PORTABLE: list[ctypes.CDLL] = []


def _portable_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if not _PORTABLE:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            pytest.skip("not x86: the engine's build already is the portable path")
        compiler = shutil.which("cc") or shutil.which("gcc")
        assert compiler is not None  # available() found one
        tmp = tmp_path_factory.mktemp("portable")
        src, so = tmp / "attn.c", tmp / "attn.so"
        src.write_text(cpu_attention._KERNEL.source())
        flags = ["-O3", "-march=x86-64-v3", "-mno-avx512f", "-fopenmp", "-shared", "-fPIC"]
        subprocess.run([compiler, *flags, str(src), "-o", str(so), "-lm"], check=True)
        defines = subprocess.run([compiler, "-march=x86-64-v3", "-mno-avx512f", "-dM", "-E", "-"],
                                 input="", capture_output=True, text=True, check=True).stdout
        assert "__AVX512F__" not in defines
        lib = ctypes.CDLL(str(Path(so)))
        for name in cpu_attention._ENTRY.values():
            if not hasattr(lib, name):  # fp16's, where the compiler has no _Float16
                continue
            kernel = getattr(lib, name)
            kernel.restype = None
            kernel.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_float]
        _PORTABLE.append(lib)
    return _PORTABLE[0]


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize(("h_q", "h_kv"), [(2, 2), (4, 2), (8, 2), (16, 2), (6, 3), (24, 1),
                                           (16, 8), (32, 8), (14, 2), (64, 8)])
@pytest.mark.parametrize("head_dim", [64, 128, 80, 48])
def test_matches_reference(kernel_path: str, block_size: int, h_q: int, h_kv: int,
                           head_dim: int) -> None:
    """GQA groups of 1, 2, 3, 4, 7, 8 and 24, in one pass over a block or several (the
    kernel takes up to 8 query heads a pass); head dims with and without a partial vector."""
    q, k_cache, v_cache, tables, lens = _case(block_size * 1000 + h_q * 10 + head_dim,
                                              block_size, h_q, h_kv, head_dim,
                                              _lens(block_size), q_scale=4.0)  # peaky
    _check(q, k_cache, v_cache, tables, lens, head_dim**-0.5)


needs_f16 = pytest.mark.skipif(not cpu_attention.serves(torch.float16),
                               reason="this compiler has no _Float16: no fp16 kernel")
HALF = [torch.bfloat16, pytest.param(torch.float16, marks=needs_f16)]


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
def test_sequences_split_between_threads_as_on_one(kernel_path: str, dtype: torch.dtype
                                                   ) -> None:
    """Enough context to wake torch's other threads: each sequence is still computed whole
    by one of them, so the result is the one thread's, bit for bit, whatever the split."""
    lens = [300, 5, 70, 1, 129, 400, 16, 17, 250, 3]
    q, k_cache, v_cache, tables, lens_t = _case(7, 16, 16, 8, 128, lens)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(cpu_attention.paged_decode(q, k_cache, v_cache, tables, lens_t, 0.09))
        for order in (list(range(len(lens)))[::-1], [3, 0, 1, 2, 4, 5, 6, 7, 8, 9]):
            got = cpu_attention.paged_decode(q[order], k_cache, v_cache, tables[order],
                                             lens_t[order], 0.09)
            outs.append(got[torch.tensor(order).argsort()])
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], out) for out in outs[1:])
    err = (outs[0].double() - _reference(q, k_cache.float(), v_cache.float(), tables, lens_t,
                                         0.09)).abs().max()
    assert err <= TOLERANCE


@pytest.mark.parametrize(("block_size", "h_q", "h_kv", "head_dim"),
                         [(16, 16, 8, 128), (16, 4, 2, 64), (8, 6, 3, 80), (32, 24, 1, 48),
                          (5, 32, 8, 128), (1, 8, 2, 64)])
@pytest.mark.parametrize("dtype", HALF)
def test_a_half_cache_is_read_as_its_exact_fp32_values(kernel_path: str, block_size: int,
                                                      h_q: int, h_kv: int, head_dim: int,
                                                      dtype: torch.dtype) -> None:
    """A bf16 or fp16 cache (such a model's) is widened exactly: against the reference on
    the same values, the fp32 tolerance holds; the answer is in q's dtype."""
    q, k_cache, v_cache, tables, lens = _case(block_size * 7 + h_q + head_dim, block_size, h_q,
                                              h_kv, head_dim, _lens(block_size), q_scale=4.0)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    _check(q, k_cache, v_cache, tables, lens, head_dim**-0.5)
    got = cpu_attention.paged_decode(q.to(dtype), k_cache, v_cache, tables, lens,
                                     head_dim**-0.5)
    want = _reference(q.to(dtype), k_cache, v_cache, tables, lens, head_dim**-0.5)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(("block_size", "h_q", "h_kv", "head_dim"),
                         [(16, 16, 8, 128), (16, 4, 2, 64), (8, 6, 3, 80), (32, 24, 1, 48),
                          (5, 32, 8, 128), (1, 8, 2, 64), (16, 8, 8, 96)])
def test_a_bf16_q_meets_a_bf16_cache_in_pairs(kernel_path: str, block_size: int, h_q: int,
                                              h_kv: int, head_dim: int) -> None:
    """A bf16 model's q is bf16 (the engine widens it for the kernel): with a bf16 cache its
    scores may come from bf16 pairs (vdpbf16ps), whose products are exact, so the fp32
    tolerance holds. Rows past a sequence's length are NaN, as stale or unwritten rows of a
    block may be: a kernel may read them, but nothing of them may reach the answer."""
    q, k_cache, v_cache, tables, lens = _case(block_size * 11 + h_q + head_dim, block_size,
                                              h_q, h_kv, head_dim, _lens(block_size),
                                              q_scale=4.0)
    q = q.to(torch.bfloat16).float()
    k_cache, v_cache = k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16)
    for i, n in enumerate(lens.tolist()):
        flat_k = k_cache[tables[i]].reshape(-1, h_kv, head_dim)
        flat_v = v_cache[tables[i]].reshape(-1, h_kv, head_dim)
        flat_k[n:], flat_v[n:] = float("nan"), float("nan")
        k_cache[tables[i]] = flat_k.view(-1, block_size, h_kv, head_dim)
        v_cache[tables[i]] = flat_v.view(-1, block_size, h_kv, head_dim)
    lens[-1] = lens[0]  # the last sequence shares the first one's first block (see _case)
    _check(q, k_cache, v_cache, tables, lens, head_dim**-0.5)


@pytest.mark.parametrize("block_size", [1, 4, 5, 16])
def test_odd_block_sizes(kernel_path: str, block_size: int) -> None:
    q, k_cache, v_cache, tables, lens = _case(block_size, block_size, 4, 2, 64, _lens(16))
    _check(q, k_cache, v_cache, tables, lens, 0.125)


@pytest.mark.parametrize("head_dim", [64, 80])
def test_one_long_sequence(kernel_path: str, head_dim: int) -> None:
    q, k_cache, v_cache, tables, lens = _case(7, 16, 8, 2, head_dim, [1000])
    _check(q, k_cache, v_cache, tables, lens, head_dim**-0.5)


def test_no_context_gives_zeros(kernel_path: str) -> None:
    q, k_cache, v_cache, tables, lens = _case(8, 16, 4, 2, 64, [0, 20, 0])
    got = cpu_attention.paged_decode(q, k_cache, v_cache, tables, lens, 0.125)
    assert torch.equal(got[0], torch.zeros_like(got[0])) and torch.equal(got[2], got[0])
    _check(q, k_cache, v_cache, tables, lens, 0.125)


@pytest.mark.parametrize("offset", [0.0, 1000.0, -1000.0])
def test_large_scores_are_stable(kernel_path: str, offset: float) -> None:
    """Scores of hundreds (and a shared offset of +-1000) overflow a softmax that does not
    subtract the running max. Integer-valued q and K make every score exact in fp32, so the
    reference is tight however large they get; the largest scores sit in early blocks for
    some sequences and in late ones for others, so both directions of the rescale run."""
    g = torch.Generator().manual_seed(11)
    bs, h_q, h_kv, d, lens = 16, 4, 2, 64, [1, 7, 40, 40, 90, 130]
    width = (max(lens) + bs - 1) // bs
    num_blocks = len(lens) * width
    k_cache = torch.randint(-3, 4, (num_blocks, bs, h_kv, d), generator=g).float()
    v_cache = torch.randn(num_blocks, bs, h_kv, d, generator=g)
    k_cache[: num_blocks // 2] *= torch.arange(num_blocks // 2).view(-1, 1, 1, 1) % 3 + 1
    k_cache[:, :, :, 0] = 1.0  # q[..., 0] shifts every score by the same amount
    tables = torch.arange(num_blocks).view(len(lens), width)
    tables[::2] = tables[::2].flip(1)
    q = torch.randint(-3, 4, (len(lens), h_q, d), generator=g).float()
    q[..., 0] = offset
    _check(q, k_cache, v_cache, tables, torch.tensor(lens), 0.5)


def test_engine_step_is_the_same_with_and_without_the_kernel(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """The torch fallback (no compiler, or IZH_CPU_ATTENTION=0) decodes the same."""
    from izh_trio.engine.attention import TORCH_BACKEND, ChunkSpec, StepAttention, get_backend

    g = torch.Generator().manual_seed(3)
    k_cache = torch.randn(32, 4, 2, 16, generator=g)
    v_cache = torch.randn(32, 4, 2, 16, generator=g)
    decodes = [ChunkSpec(query_start=i, query_len=1, context_len=n,
                         block_table=list(range(8 * i, 8 * i + (n + 3) // 4)))
               for i, n in enumerate([3, 9, 30])]
    step = StepAttention(slots=[0, 1, 2], prefills=[], decodes=decodes, block_size=4)
    q = torch.randn(3, 4, 16, generator=g)
    kv = torch.zeros(3, 2, 16)
    cpu = torch.device("cpu")
    kernel = get_backend("auto", cpu, torch.float32)
    assert kernel.name == "cpu"
    in_place = kernel.build_metadata(step, cpu, 2).paged_attention(q, kv, kv, k_cache, v_cache,
                                                                    0.25)
    monkeypatch.setattr(cpu_attention._KERNEL, "_lib", False)
    assert get_backend("auto", cpu, torch.float32) is TORCH_BACKEND
    slow = TORCH_BACKEND.build_metadata(step, cpu, 2)
    torch.testing.assert_close(in_place, slow.paged_attention(q, kv, kv, k_cache, v_cache, 0.25),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("order", ["kernel_chunks_last", "sdpa_chunk_last"])
def test_prefill_chunks_in_place_match_the_torch_path(monkeypatch: pytest.MonkeyPatch,
                                                      order: str) -> None:
    """Short prefill chunks go to the kernel as rows with their own context: a fresh prompt,
    one continuing a cached prefix (a prefix-cache hit or a later chunk), and a chunk too big
    for the kernel (SDPA) placed before the kernel's rows (they stay one slice) or between
    them (they are gathered by index), with decodes after; the torch path must agree."""
    from izh_trio.engine.attention import TORCH_BACKEND, ChunkSpec, StepAttention, cpu_kernel

    g = torch.Generator().manual_seed(5)
    bs, h_q, h_kv, d = 4, 4, 2, 16
    k_cache = torch.randn(96, bs, h_kv, d, generator=g)
    v_cache = torch.randn(96, bs, h_kv, d, generator=g)
    monkeypatch.setattr(cpu_kernel, "IN_PLACE_PREFILL_WORK", 40 * 40)
    fresh, cached, big = (5, 5), (3, 22), (44, 44)  # (query_len, context_len)
    layout = [big, fresh, cached] if order == "kernel_chunks_last" else [fresh, big, cached]
    prefills, row = [], 0
    for i, (n, ctx) in enumerate(layout):
        table = list(range(12 * i, 12 * i + (ctx + bs - 1) // bs))
        prefills.append(ChunkSpec(query_start=row, query_len=n, context_len=ctx,
                                  block_table=table))
        row += n
    decodes = [ChunkSpec(query_start=row + j, query_len=1, context_len=n,
                         block_table=list(range(48 + 12 * j, 48 + 12 * j + (n + bs - 1) // bs)))
               for j, n in enumerate([1, 9, 30])]
    total = row + len(decodes)
    step = StepAttention(slots=list(range(total)), prefills=prefills, decodes=decodes,
                         block_size=bs)
    q = torch.randn(total, h_q, d, generator=g)
    # A fresh chunk attends to the K/V it just stored: the same rows as in its cache slots.
    k = torch.empty(total, h_kv, d)
    v = torch.empty(total, h_kv, d)
    for c in prefills:
        for i in range(c.query_len):
            pos = c.context_len - c.query_len + i
            blk = c.block_table[pos // bs]
            k[c.query_start + i] = k_cache[blk, pos % bs]
            v[c.query_start + i] = v_cache[blk, pos % bs]
    cpu = torch.device("cpu")
    fast = cpu_kernel.CPU_KERNEL_BACKEND.build_metadata(step, cpu, h_kv)
    assert [c.query_start for c in fast.prefills] == [
        c.query_start for c in prefills if c.query_len * c.context_len > 40 * 40]
    assert (fast.rows is None) == (order == "kernel_chunks_last")
    in_place = fast.paged_attention(q, k, v, k_cache, v_cache, 0.25)
    slow = TORCH_BACKEND.build_metadata(step, cpu, h_kv)
    torch.testing.assert_close(in_place, slow.paged_attention(q, k, v, k_cache, v_cache, 0.25),
                               atol=1e-5, rtol=1e-5)
