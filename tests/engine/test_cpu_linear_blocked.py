"""The blocked linear kernel against the exact product of the same values: in fp32 within
fp32 summation's bound, in bf16 and fp16 one rounding from the fp32 sums, at any row count,
thread count and shape (odd K, N off the block), with and without a bias, as built here and
as built for a CPU with AVX-512 but no AVX512-BF16 (bf16 widened as it streams); and how
``pack_linears`` chooses it."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from izh_trio.engine import cpu_linear, cpu_linear_blocked
from izh_trio.engine.cpu_linear import PackedLinear, pack_linears
from izh_trio.engine.cpu_linear_blocked import BlockedLinear

needs_fp32 = pytest.mark.skipif(not cpu_linear_blocked.available(torch.float32),
                                reason="no AVX-512 here (or no compiler): oneDNN's serves")
needs_bf16 = pytest.mark.skipif(not cpu_linear_blocked.available(torch.bfloat16),
                                reason="no AVX512-BF16 here (or no compiler): oneDNN's serves")
needs_f16 = pytest.mark.skipif(not cpu_linear_blocked.available(torch.float16),
                               reason="no AVX-512 with F16C here (or no compiler)")
DTYPES = [pytest.param(torch.float32, marks=needs_fp32),
          pytest.param(torch.bfloat16, marks=needs_bf16),
          pytest.param(torch.float16, marks=needs_f16)]


_BUILDS: dict[str, ctypes.CDLL] = {}
#: Builds for other CPUs that this one also runs: one without AMX (bf16 on vdpbf16ps), one for
#: Skylake-SP (AVX-512 with BW, VL and F16C, no AVX512-BF16: bf16 widened as it streams).
_FLAGS = {"no-amx": ["-march=native", "-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8"],
          "no-avx512-bf16": ["-march=skylake-avx512"]}


def _cpu_has_amx() -> bool:
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def _build_lib(name: str, tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The kernel built with ``_FLAGS[name]``."""
    if name not in _BUILDS:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            pytest.skip("not x86")
        compiler = shutil.which("cc") or shutil.which("gcc")
        assert compiler is not None  # available() found one
        flags = ["-O3", *_FLAGS[name], "-fopenmp", "-shared", "-fPIC"]
        defines = subprocess.run([compiler, *_FLAGS[name], "-dM", "-E", "-"], input="",
                                 capture_output=True, text=True, check=True).stdout
        assert "__AMX_BF16__" not in defines
        if name == "no-avx512-bf16":
            assert "__AVX512BF16__" not in defines and "__AVX512BW__" in defines
        tmp = tmp_path_factory.mktemp(name)
        src, so = tmp / "linear.c", tmp / "linear.so"
        src.write_text(cpu_linear_blocked._KERNEL.source())
        subprocess.run([compiler, *flags, str(src), "-o", str(so)], check=True)
        lib = ctypes.CDLL(str(so))
        for fn, (restype, argtypes) in cpu_linear_blocked._KERNEL.signatures.items():
            getattr(lib, fn).restype, getattr(lib, fn).argtypes = restype, list(argtypes)
        assert lib.tiles() == 0
        if name == "no-avx512-bf16":
            assert lib.supported() == 7  # fp32, bf16 (widened: no BF16_PRODUCTS) and fp16
        _BUILDS[name] = lib
    return _BUILDS[name]


@pytest.fixture(params=["here", "no-amx", "no-avx512-bf16"])
def build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Runs a test on the engine's build, then (on a CPU with AMX) on a build without it, then
    on the build for a CPU without AVX512-BF16."""
    if request.param == "no-amx" and not _cpu_has_amx():
        pytest.skip("no AMX here: the engine's build is the vdpbf16ps one")
    if request.param != "here":
        monkeypatch.setattr(cpu_linear_blocked._KERNEL, "_lib",
                            _build_lib(request.param, tmp_path_factory))
    yield request.param


def test_bf16_takes_amx_tiles_where_the_cpu_has_them() -> None:
    """On a CPU with AMX the engine's build multiplies bf16 in tiles (the step's arithmetic
    then hides under its memory reads) unless IZH_CPU_AMX=0; elsewhere it cannot claim to."""
    if not cpu_linear_blocked.available(torch.bfloat16):
        pytest.skip("no bf16 kernel here")
    layer = BlockedLinear(cpu_linear_blocked.pack(torch.randn(32, 64).bfloat16()), None, 64, 32)
    layer(torch.randn(2, 64).bfloat16())  # the first bf16 call asks the kernel for the tiles
    declined = os.environ.get("IZH_CPU_AMX") == "0"
    assert cpu_linear_blocked.bf16_in_tiles() == (_cpu_has_amx() and not declined)


def _exact(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The product of the bf16 or fp16 values in float64, before any rounding."""
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(96, 256), (40, 97), (33, 1024), (1, 2), (200, 3)])
@pytest.mark.parametrize("bias", [False, True])
def test_within_the_rounding_of_the_exact_product(build: str, dtype: torch.dtype,
                                                   threads: int, n: int, k: int,
                                                   bias: bool) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(n * k)
        w = torch.randn(n, k).to(dtype)
        b = torch.randn(n).to(dtype) if bias else None
        layer = BlockedLinear(cpu_linear_blocked.pack(w), b, k, n)
        for rows in (1, 3, 8, 9, 16, 31, 257):
            x = torch.randn(rows, k).to(dtype)
            got = layer(x)
            assert got.dtype == dtype and got.shape == (rows, n)
            exact = _exact(x, w, b)
            magnitude = x.double().abs() @ w.double().abs().T + (
                0 if b is None else b.double().abs())
            # fp32 sums of k + 1 terms, one rounding each (2^-24 of the running sum at
            # most); bf16 then rounds once more (2^-8 of the value), fp16 too (2^-11, or
            # half its smallest subnormal, 2^-25)
            bound = (k + 1) * 2.0 ** -24 * magnitude * 1.01
            if dtype == torch.bfloat16:
                bound = bound + exact.abs() * 2.0 ** -8
            if dtype == torch.float16:
                bound = bound + exact.abs() * 2.0 ** -11 + 2.0 ** -25
            err = (got.double() - exact).abs()
            assert bool((err <= bound + 1e-30).all()), float((err - bound).max())
            want = F.linear(x, w, b)  # oneDNN's: the same arithmetic, the sums reordered
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            assert torch.allclose(got.float(), want.float(), rtol=tol,
                                  atol=tol * float(want.float().abs().max()))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_leading_dims_and_empty_batches(build: str, dtype: torch.dtype) -> None:
    w = torch.randn(24, 64).to(dtype)
    layer = BlockedLinear(cpu_linear_blocked.pack(w), None, 64, 24)
    x = torch.randn(2, 5, 64).to(dtype)
    assert torch.equal(layer(x), layer(x.reshape(10, 64)).reshape(2, 5, 24))
    assert layer(torch.empty(0, 64, dtype=dtype)).shape == (0, 24)
    strided = torch.randn(64, 6).to(dtype).T  # not contiguous: made so, not misread
    assert torch.equal(layer(strided), layer(strided.contiguous()))


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_infinity_come_out_as_torch_gives_them(build: str, dtype: torch.dtype) -> None:
    """A NaN in a row makes that row's outputs NaN, with torch's bits in bf16 (0x7FC0, however
    the CPU would round it); an infinity stays one; the other rows are untouched."""
    torch.manual_seed(5)
    w = torch.randn(48, 40).to(dtype)
    layer = BlockedLinear(cpu_linear_blocked.pack(w), None, 40, 48)
    x = torch.randn(8, 40).to(dtype)
    x[2, 3], x[5, 0] = float("nan"), float("inf")
    got, want = layer(x), F.linear(x, w)
    assert bool(got[2].isnan().all())
    if dtype == torch.bfloat16:
        assert bool((got[2].view(torch.int16) == 0x7FC0).all())
    assert torch.equal(got[5].isinf(), want[5].isinf()) and bool(got[5].isinf().any())
    rest = [0, 1, 3, 4, 6, 7]
    assert torch.allclose(got[rest].float(), want[rest].float(), rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_linears_puts_a_large_model_on_the_kernel_alone(
        dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_linear, "TWO_COPY_LIMIT", 0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 16)).to(dtype)
    assert pack_linears(model) == 2
    assert all(isinstance(m, BlockedLinear) for m in model)


@needs_f16
def test_fp16_takes_the_kernel_alone_at_any_size() -> None:
    """oneDNN's fp16 is emulated on a CPU without fp16 arithmetic: even a small model (two
    copies allowed) keeps the blocked copy alone, for every row count."""
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 16)).half()
    assert pack_linears(model) == 2
    assert all(isinstance(m, BlockedLinear) for m in model)
    x = torch.randn(40, 64).half()
    assert model(x).dtype == torch.float16 and model(x).shape == (40, 16)


@needs_bf16
def test_switch_off_or_a_wrong_probe_leaves_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_linear, "TWO_COPY_LIMIT", 0)
    real = cpu_linear_blocked.pack
    monkeypatch.setattr(cpu_linear_blocked, "pack", lambda w: real(w * 1.5))
    model = nn.Sequential(nn.Linear(64, 32).bfloat16(), nn.Linear(32, 16).bfloat16())
    assert pack_linears(model) == 2
    assert all(isinstance(m, PackedLinear) for m in model)  # refused once, then not tried
    monkeypatch.setattr(cpu_linear_blocked, "pack", real)
    monkeypatch.setattr(cpu_linear_blocked._KERNEL, "switch", "IZH_TEST_BLOCKED_SWITCH")
    monkeypatch.setattr(cpu_linear_blocked._KERNEL, "_lib", None)
    monkeypatch.setenv("IZH_TEST_BLOCKED_SWITCH", "0")
    assert not cpu_linear_blocked.available(torch.float32)
    model = nn.Sequential(nn.Linear(64, 32))
    assert pack_linears(model) == 1 and isinstance(model[0], PackedLinear)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", [2, 3])
def test_every_block_once_whichever_thread_takes_it(dtype: torch.dtype, threads: int) -> None:
    """Threads take blocks from their own shares and from each other's: however a call's
    blocks end up split (it varies with the threads' pace), each is written once, by one
    thread, so the output is one thread's bit for bit, with nothing left unwritten."""
    before = torch.get_num_threads()
    try:
        torch.manual_seed(threads)
        n, k = 32 * 37 + 5, 160  # 38 blocks, the last partly filled
        w = torch.randn(n, k).to(dtype)
        layer = BlockedLinear(cpu_linear_blocked.pack(w), None, k, n)
        x = torch.randn(8, k).to(dtype)
        torch.set_num_threads(1)
        want = layer(x)
        torch.set_num_threads(threads)
        for _ in range(200):
            got = layer(x)
            assert torch.equal(got, want)
    finally:
        torch.set_num_threads(before)


@needs_fp32
def test_the_kernel_follows_torchs_thread_count() -> None:
    """It shares torch's OpenMP runtime: the count the engine's thread plan sets is its own."""
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert cpu_linear_blocked._KERNEL.lib.max_threads() == n
    finally:
        torch.set_num_threads(before)
