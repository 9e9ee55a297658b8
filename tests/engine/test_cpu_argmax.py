"""The compiled row argmax answers exactly what ``torch.argmax(dim=-1)`` does."""

from __future__ import annotations

import ctypes
import math
import platform

import pytest
import torch

from izh_trio.engine import cbuild, cpu_argmax

pytestmark = pytest.mark.skipif(not cpu_argmax.available(), reason="no C compiler")


@pytest.fixture(autouse=True, params=["native", "portable"])
def kernel_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the engine's build, then with the source built without AVX-512."""
    if request.param == "portable":
        if platform.machine().lower() not in ("x86_64", "amd64"):
            pytest.skip("not x86: the engine's build already is the portable path")
        lib = cbuild.build("cpu_argmax", cpu_argmax._KERNEL.source(),
                           ("-march=x86-64-v3", "-mno-avx512f"),
                           directory=tmp_path_factory.mktemp("portable"))
        assert lib is not None
        lib.argmax_rows.restype = None
        lib.argmax_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                    ctypes.c_void_p]
        monkeypatch.setattr(cpu_argmax._KERNEL, "_lib", lib)
    return request.param


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 33, 2000, 151_936])
def test_random_rows(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(64, vocab, generator=g)
    assert torch.equal(cpu_argmax.argmax_rows(x), x.argmax(dim=-1))


def test_ties_nans_infinities_and_masks() -> None:
    """Equal maxima (first wins, across and within vector lanes), NaN anywhere (first NaN
    wins), +inf, rows masked to -inf but one entry, fully masked rows, signed zeros."""
    v = 37  # two full vectors and a tail
    rows = []
    for a, b in [(0, 16), (3, 35), (20, 4), (36, 0), (5, 21)]:
        r = torch.full((v,), -1.0)
        r[a] = r[b] = 2.0
        rows.append(r)
    for i in (0, 17, 36):
        r = torch.randn(v)
        r[i] = math.nan
        rows.append(r)
    r = torch.randn(v)
    r[30], r[31] = math.nan, math.inf
    rows.append(r)
    r = torch.randn(v)
    r[9] = math.inf
    rows.append(r)
    for i in (0, 22, 36):
        r = torch.full((v,), -math.inf)
        r[i] = -5.0
        rows.append(r)
    rows.append(torch.full((v,), -math.inf))
    rows.append(torch.full((v,), math.nan))
    r = torch.zeros(v)
    r[0], r[3] = -0.0, 0.0
    rows.append(r)
    x = torch.stack(rows)
    assert torch.equal(cpu_argmax.argmax_rows(x), x.argmax(dim=-1))


def test_views_and_other_tensors_fall_back_or_match() -> None:
    x = torch.randn(8, 100)
    assert torch.equal(cpu_argmax.argmax_rows(x[:, 10:90]), x[:, 10:90].argmax(dim=-1))
    assert torch.equal(cpu_argmax.argmax_rows(x.T), x.T.argmax(dim=-1))
    half = x.half()
    assert torch.equal(cpu_argmax.argmax_rows(half), half.argmax(dim=-1))
    assert cpu_argmax.argmax_rows(torch.empty(0, 100)).shape == (0,)
