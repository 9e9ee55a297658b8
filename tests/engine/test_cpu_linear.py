"""Linear layers packed for oneDNN against ``F.linear`` on the same weights, and in the model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from izh_trio.engine import cpu_linear, cpu_linear_blocked
from izh_trio.engine.cpu_linear import PackedLinear, pack_linears
from izh_trio.engine.cpu_linear_blocked import BlockedLinear
from izh_trio.engine.model_runner import ModelRunner
from izh_trio.wire import EngineConfig

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="this torch build has no oneDNN: linears stay plain")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_matches_plain_for_any_row_count(dtype: torch.dtype, bias: bool) -> None:
    if dtype not in cpu_linear._packable_dtypes():
        pytest.skip("no native bf16 in oneDNN here: bf16 layers stay plain")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 96, bias=bias), nn.Linear(96, 40, bias=bias)).to(dtype)
    plain = [(m.weight.detach().clone(), None if m.bias is None else m.bias.detach().clone())
             for m in model]
    assert pack_linears(model) == 2
    assert all(isinstance(m, (PackedLinear, BlockedLinear)) for m in model)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for rows in (1, 7, 32, 257):
        x = torch.randn(rows, 256).to(dtype)
        want = F.linear(F.linear(x, *plain[0]), *plain[1])
        got = model(x)
        assert got.dtype == dtype and got.shape == (rows, 40)
        assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol * 10)
    x3 = torch.randn(2, 5, 256).to(dtype)  # leading batch dims pass through, as for nn.Linear
    assert model(x3).shape == (2, 5, 40)


def test_switch_off_keeps_plain_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IZH_ONEDNN_LINEAR", "0")
    model = nn.Sequential(nn.Linear(8, 8))
    assert pack_linears(model) == 0 and type(model[0]) is nn.Linear


def test_a_disagreeing_pack_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe is what protects the engine from a broken build: a wrong product is refused."""
    real = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(cpu_linear.torch.ops.mkldnn, "_reorder_linear_weight",
                        lambda w: real(w * 1.01), raising=False)
    model = nn.Sequential(nn.Linear(64, 32))
    if cpu_linear_blocked.available(torch.float32):  # then the blocked kernel serves alone
        assert pack_linears(model) == 1 and isinstance(model[0], BlockedLinear)
    monkeypatch.setattr(cpu_linear_blocked, "available", lambda dtype: False)
    model = nn.Sequential(nn.Linear(64, 32))
    assert pack_linears(model) == 0 and type(model[0]) is nn.Linear


def test_engine_model_runs_packed(tiny_dir: Path) -> None:
    """Every linear of the real model on CPU is packed (transformers agreement is checked by
    ``test_qwen3_vs_transformers`` on this same path)."""
    model = ModelRunner(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=8)).model
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert sum(isinstance(m, (PackedLinear, BlockedLinear)) for m in model.modules()) > 0


def test_few_rows_run_on_a_second_copy_of_a_small_model(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A decode step's few rows are faster on the blocked kernel (or, without it, one row on
    MKL's GEMV): a small model keeps that copy beside oneDNN's; above the limit only one copy
    is kept (no doubled memory), the blocked one where the kernel serves."""
    torch.manual_seed(0)
    blocked = cpu_linear_blocked.available(torch.float32)
    small = nn.Sequential(nn.Linear(64, 32))
    w, b = small[0].weight.detach().clone(), small[0].bias.detach().clone()
    assert pack_linears(small) == 1 and isinstance(small[0], PackedLinear)
    few_rows = cpu_linear_blocked.ROWS_PER_PASS if blocked else 1
    assert small[0].few is not None and small[0].few_rows == few_rows
    calls, few = [], small[0].few
    small[0].few = lambda x: calls.append(len(x)) or few(x)
    x = torch.randn(few_rows, 64)
    assert torch.allclose(small(x), x @ w.T + b, atol=1e-5) and calls == [few_rows]
    more = torch.randn(few_rows + 1, 64)
    assert torch.allclose(small(more), more @ w.T + b, atol=1e-5)
    assert calls == [few_rows]  # more rows: oneDNN's packed weight
    monkeypatch.setattr(cpu_linear, "TWO_COPY_LIMIT", 0)
    big = nn.Sequential(nn.Linear(64, 32))
    assert pack_linears(big) == 1
    if blocked:
        assert isinstance(big[0], BlockedLinear)
    else:
        assert isinstance(big[0], PackedLinear) and big[0].few is None


def test_without_the_blocked_kernel_one_row_runs_on_the_plain_weight(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_linear_blocked, "available", lambda dtype: False)
    small = nn.Sequential(nn.Linear(64, 32))
    assert pack_linears(small) == 1 and small[0].few_rows == 1
    calls, linear = [], F.linear
    monkeypatch.setattr(torch.nn.modules.linear.F, "linear",
                        lambda *a: calls.append(1) or linear(*a))
    small(torch.randn(1, 64))
    assert calls == [1]
    small(torch.randn(3, 64))
    assert calls == [1]
