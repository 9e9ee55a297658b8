"""The decode steps' layers in one compiled call (``models/cpu_decode.py``) against the modules
they chain, on checkpoints made by transformers: the same tokens and bitwise the same
logprobs (so the same logits) for several sequences decoding together, in fp32, bf16 and
fp16, for Qwen3 (q/k norms, head_dim 32 and 128) and Llama/Qwen2 (biases), with more rows
than one pass of the linear kernel takes; and the models and steps it must leave to the
modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import torch

from izh_trio.engine import cpu_fused, cpu_linear, cpu_linear_blocked
from izh_trio.engine.core import EngineCore
from izh_trio.engine.models.base import DecoderStack
from izh_trio.wire import AddRequest, EngineConfig, SamplingParams, TokenLogprobs
from tests.conftest import save_transformers_qwen3
from tests.engine.test_llama_qwen2 import make_family

if not cpu_linear_blocked.available(torch.float32):
    pytest.skip("the blocked linear kernel does not run on this CPU", allow_module_level=True)

PROMPTS = [[3, 141, 59, 265, 358, 979, 323, 846], [1200, 7], list(range(40, 140)),
           [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]


def _engine(model_dir: Path, dtype: str) -> EngineCore:
    return EngineCore(EngineConfig(model_dir=str(model_dir), dtype=dtype, num_kv_blocks=128,
                                   block_size=8, max_num_seqs=16))


class _Counted:
    """The model's compiled layers, counting the steps they took."""

    def __init__(self, model: DecoderStack) -> None:
        assert model.decode_layers is not None, "the compiled layers were not built"
        self.real, self.taken = model.decode_layers, 0
        model.decode_layers = self  # type: ignore[assignment]

    def __call__(self, *args: object) -> object:
        done = self.real(*args)  # type: ignore[arg-type]
        self.taken += done is not None
        return done


def _generate(core: EngineCore, prompts: list[list[int]], n: int
              ) -> dict[str, tuple[list[int], list[TokenLogprobs]]]:
    """Every prompt at once, greedy, ``n`` tokens each, with their logprobs."""
    for i, prompt in enumerate(prompts):
        core.add_request(AddRequest(f"r{i}", prompt, SamplingParams(
            max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=3)))
    out: dict[str, tuple[list[int], list[TokenLogprobs]]] = {}
    while core.has_work:
        for o in core.step():
            tokens, logprobs = out.setdefault(o.request_id, ([], []))
            tokens += o.new_token_ids
            logprobs += o.logprobs or ()
    return out


def _compare(model_dir: Path, dtype: str, prompts: list[list[int]], n: int = 6) -> int:
    """The same requests through the compiled layers and through the modules; how many
    steps the compiled layers took."""
    compiled, modules = _engine(model_dir, dtype), _engine(model_dir, dtype)
    counted = _Counted(compiled.runner.model)
    modules.runner.model.decode_layers = None
    assert _generate(compiled, prompts, n) == _generate(modules, prompts, n)
    return counted.taken


@pytest.fixture(scope="module")
def qwen3_dirs(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decode")
    return {
        "hd32": save_transformers_qwen3(root / "hd32", tiny_dir, seed=3),
        "hd128": save_transformers_qwen3(root / "hd128", tiny_dir, seed=4, head_dim=128,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         tie=False),
    }


DTYPES = ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    not cpu_linear_blocked.available(torch.bfloat16), reason="no AVX512-BF16 here")),
          pytest.param("float16", marks=pytest.mark.skipif(
              not (cpu_linear_blocked.available(torch.float16)
                   and cpu_fused.serves(torch.float16)), reason="no F16C or no _Float16"))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ["hd32", "hd128"])
def test_qwen3_decode_steps_are_the_modules_bit_for_bit(qwen3_dirs: dict[str, Path],
                                                          shape: str, dtype: str) -> None:
    taken = _compare(qwen3_dirs[shape], dtype, PROMPTS)
    assert taken >= 5  # every step after the prompts' is a decode step of every sequence


@pytest.mark.parametrize("family", ["llama-mha-biases-llama3", "qwen2-gqa", "llama-gqa-tied"])
def test_llama_and_qwen2_decode_steps_too(tmp_path: Path, tiny_dir: Path, family: str) -> None:
    model_dir = make_family(family, tmp_path / family, tiny_dir)
    assert _compare(model_dir, "float32", PROMPTS) >= 5


@pytest.fixture
def blocked_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every linear on the blocked kernel alone, as a large model's are: then the compiled
    layers take steps of any row count."""
    monkeypatch.setattr(cpu_linear, "TWO_COPY_LIMIT", 0)
    yield


@pytest.mark.parametrize("dtype", DTYPES)
def test_more_rows_than_one_pass_of_the_linear_kernel(qwen3_dirs: dict[str, Path], dtype: str,
                                                      blocked_only: None) -> None:
    rows = cpu_linear_blocked.ROWS_PER_PASS + 3
    prompts = [[(17 * i + j) % 1900 + 30 for j in range(3 + i)] for i in range(rows)]
    assert _compare(qwen3_dirs["hd32"], dtype, prompts, n=4) >= 3


def test_a_small_models_many_rows_stay_on_onednn(qwen3_dirs: dict[str, Path]) -> None:
    """A small model keeps oneDNN's linears beside the blocked ones, for more rows than a
    pass: such a step is the modules', and still the same answer."""
    rows = cpu_linear_blocked.ROWS_PER_PASS + 2
    prompts = [[(11 * i + j) % 1900 + 30 for j in range(4)] for i in range(rows)]
    assert _compare(qwen3_dirs["hd32"], "float32", prompts, n=4) == 0


@pytest.mark.parametrize("family", ["qwen3-moe-8x2", "mistral-window-32"])
def test_models_it_does_not_chain_keep_their_modules(tmp_path: Path, tiny_dir: Path,
                                                     family: str) -> None:
    """A mixture of experts is not built; a sliding window's steps are not the attention
    kernel's, so they are never taken."""
    core = _engine(make_family(family, tmp_path / family, tiny_dir), "float32")
    model = core.runner.model
    if family.startswith("qwen3-moe"):
        assert model.decode_layers is None
        return
    counted = _Counted(model)
    _generate(core, PROMPTS[:2], 4)
    assert counted.taken == 0


def test_lora_keeps_the_modules(tmp_path: Path, qwen3_dirs: dict[str, Path]) -> None:
    core = EngineCore(EngineConfig(model_dir=str(qwen3_dirs["hd32"]), num_kv_blocks=64,
                                   lora_runtime_updates=True))
    assert core.runner.model.decode_layers is None


def test_a_slot_outside_the_cache_is_an_error_not_a_write(qwen3_dirs: dict[str, Path]) -> None:
    """As the modules' KV store refuses it: the call fails with IndexError at the first
    layer's store, and no layer after it runs (their caches are untouched)."""
    core = _engine(qwen3_dirs["hd32"], "float32")
    model = core.runner.model
    seen: dict[str, object] = {}
    real = model.decode_layers
    assert real is not None

    def grab(*args: object) -> object:
        seen["args"] = args
        return real(*args)  # type: ignore[arg-type]

    model.decode_layers = grab  # type: ignore[assignment]
    _generate(core, PROMPTS[:2], 3)
    x, rotation, meta, caches = seen["args"]  # type: ignore[misc]
    slots = meta.slot_mapping.clone()
    slots[-1] = caches[0][0].shape[0] * caches[0][0].shape[1]  # one past the last slot
    before = [(k.clone(), v.clone()) for k, v in caches]
    with pytest.raises(IndexError, match="1 of 2 KV slots outside the cache"):
        real(x, rotation, attrs.evolve(meta, slot_mapping=slots), caches)
    assert all(torch.equal(k, k0) and torch.equal(v, v0)
               for (k, v), (k0, v0) in zip(caches[1:], before[1:], strict=True))
