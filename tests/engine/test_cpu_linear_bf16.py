"""The bf16 linear kernel against an fp32 product of the same bf16 values: one rounding
apart, at any row count, thread count and shape (odd K, N off the block), with and
without a bias; and how ``pack_linears`` chooses it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from izh_trio.engine import cpu_linear_bf16
from izh_trio.engine.cpu_linear import PackedLinear, pack_linears
from izh_trio.engine.cpu_linear_bf16 import Bf16Linear

pytestmark = pytest.mark.skipif(not cpu_linear_bf16.available(),
                                reason="no AVX512-BF16 here (or no compiler): oneDNN's serves")


def _exact(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The product of the bf16 values in float64, before any rounding."""
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(96, 256), (40, 97), (33, 1024), (1, 2), (200, 3)])
@pytest.mark.parametrize("bias", [False, True])
def test_one_rounding_from_the_exact_product(threads: int, n: int, k: int, bias: bool) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(n * k)
        w = torch.randn(n, k).bfloat16()
        b = torch.randn(n).bfloat16() if bias else None
        layer = Bf16Linear(cpu_linear_bf16.pack(w), b, k, n)
        for rows in (1, 3, 8, 9, 16, 31, 257):
            x = torch.randn(rows, k).bfloat16()
            got = layer(x)
            assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
            exact = _exact(x, w, b)
            # fp32 sums of up to k products, then one bf16 rounding (2^-8 of the value)
            err = (got.double() - exact).abs()
            bound = exact.abs() * 2.0 ** -8 + 1e-4 * (x.double().abs() @ w.double().abs().T)
            assert bool((err <= bound + 1e-30).all()), float((err - bound).max())
            want = F.linear(x, w, b)  # oneDNN's: the same arithmetic, the sums reordered
            assert torch.allclose(got.float(), want.float(), rtol=2e-2,
                                  atol=2e-2 * float(want.float().abs().max()))
    finally:
        torch.set_num_threads(before)


def test_leading_dims_and_empty_batches() -> None:
    w = torch.randn(24, 64).bfloat16()
    layer = Bf16Linear(cpu_linear_bf16.pack(w), None, 64, 24)
    x = torch.randn(2, 5, 64).bfloat16()
    assert torch.equal(layer(x), layer(x.reshape(10, 64)).reshape(2, 5, 24))
    assert layer(torch.empty(0, 64, dtype=torch.bfloat16)).shape == (0, 24)
    strided = torch.randn(64, 6).bfloat16().T  # not contiguous: made so, not misread
    assert torch.equal(layer(strided), layer(strided.contiguous()))


def test_pack_linears_puts_bf16_on_the_kernel_and_fp32_on_onednn() -> None:
    model = nn.Sequential(nn.Linear(64, 32).bfloat16(), nn.Linear(32, 16))
    assert pack_linears(model) == 2
    assert isinstance(model[0], Bf16Linear) and isinstance(model[1], PackedLinear)


def test_switch_off_or_a_wrong_probe_leaves_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    real = cpu_linear_bf16.pack
    monkeypatch.setattr(cpu_linear_bf16, "pack", lambda w: real(w * 1.5))
    model = nn.Sequential(nn.Linear(64, 32).bfloat16(), nn.Linear(32, 16).bfloat16())
    assert pack_linears(model) == 2
    assert all(isinstance(m, PackedLinear) for m in model)  # refused once, then not tried
    monkeypatch.setattr(cpu_linear_bf16, "pack", real)
    monkeypatch.setattr(cpu_linear_bf16._KERNEL, "switch", "IZH_TEST_BF16_SWITCH")
    monkeypatch.setattr(cpu_linear_bf16._KERNEL, "_lib", None)
    monkeypatch.setenv("IZH_TEST_BF16_SWITCH", "0")
    assert not cpu_linear_bf16.available()
    model = nn.Sequential(nn.Linear(64, 32).bfloat16())
    assert pack_linears(model) == 1 and isinstance(model[0], PackedLinear)


def test_the_kernel_follows_torchs_thread_count() -> None:
    """It shares torch's OpenMP runtime: the count the engine's thread plan sets is its own."""
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert cpu_linear_bf16._KERNEL.lib.max_threads() == n
    finally:
        torch.set_num_threads(before)
