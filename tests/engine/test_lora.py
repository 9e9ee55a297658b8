"""LoRA adapters per request against peft's merged models (fp32, transformers-made Qwen3).

Two adapters saved by peft: ``qv`` (rank 4, q/v only) and ``all`` (rank 8, all seven linear
modules, rsLoRA scaling). Our engine applies them unmerged, per token group, in mixed batches.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from izh_trio.engine.block_manager import BlockManager
from izh_trio.engine.core import EngineCore
from izh_trio.engine.loader import ModelConfig
from izh_trio.engine.lora.adapter import LoraError, LoraTargets, load_adapter, read_config
from izh_trio.engine.model_runner import ModelRunner
from izh_trio.engine.models.qwen3 import Qwen3ForCausalLM
from izh_trio.engine.scheduler import ScheduledSeq
from izh_trio.engine.sequence import Sequence
from izh_trio.wire import (
    AddRequest,
    EngineConfig,
    LoadLora,
    RequestFailed,
    SamplingParams,
    UnloadLora,
)
from tests.conftest import save_transformers_qwen3
from tests.lora_helpers import ALL_SEVEN, ATTENTION_QV, greedy, merged_model, save_peft_lora

ATOL = 1e-4
N = 16
PROMPTS = {"p0": [11, 400, 7, 1500, 33, 2, 901, 45, 12], "p1": [1800, 5],
           "p2": list(range(100, 123))}
ADAPTERS = (None, "qv", "all")
GREEDY = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Path:
    # A wider init than transformers' default, so that greedy outputs vary token to token.
    return save_transformers_qwen3(tmp_path_factory.mktemp("lora") / "base", tiny_dir, seed=3,
                                   initializer_range=0.1)


@pytest.fixture(scope="module")
def adapters(base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {"qv": save_peft_lora(root / "qv", base, r=4, alpha=8, targets=ATTENTION_QV, seed=1),
            "all": save_peft_lora(root / "all", base, r=8, alpha=16, targets=ALL_SEVEN, seed=2,
                                  use_rslora=True)}


@pytest.fixture(scope="module")
def references(base: Path, adapters: dict[str, Path]) -> dict:
    return {name: merged_model(base, adapters.get(name)) for name in ADAPTERS}


@pytest.fixture(scope="module")
def expected(references: dict) -> dict[tuple[str | None, str], list[int]]:
    return {(name, p): greedy(references[name], ids, N)
            for name in ADAPTERS for p, ids in PROMPTS.items()}


def make_core(base: Path, adapters: dict[str, Path], **cfg: object) -> EngineCore:
    cfg = {"num_kv_blocks": 96, "block_size": 4, **cfg}
    return EngineCore(EngineConfig(model_dir=str(base), lora_modules=tuple(
        (name, str(path)) for name, path in adapters.items()), **cfg))


def run(core: EngineCore, requests: dict[str, tuple[str, str | None]]
        ) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Every request at once: rid -> (prompt name, adapter); tokens and cached counts."""
    for rid, (prompt, adapter) in requests.items():
        assert core.add_request(AddRequest(rid, PROMPTS[prompt], GREEDY,
                                           lora_name=adapter)) is None
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    cached: dict[str, int] = {}
    while core.has_work:
        for out in core.step():
            tokens[out.request_id] += out.new_token_ids
            cached[out.request_id] = out.num_cached_tokens
    assert core.block_manager.usage == 0.0
    assert not core.scheduler.loras.pinned
    return tokens, cached


COMBOS = {f"{a}-{p}": (p, a) for a in ADAPTERS for p in PROMPTS}


@pytest.fixture(scope="module")
def solo(base: Path, adapters: dict[str, Path]) -> dict[str, list[int]]:
    core = make_core(base, adapters)
    return {rid: run(core, {rid: combo})[0][rid] for rid, combo in COMBOS.items()}


# --- numerics -------------------------------------------------------------------------------


def test_logits_match_peft_merged_in_a_mixed_batch(base: Path, adapters: dict[str, Path],
                                                   references: dict) -> None:
    runner = ModelRunner(EngineConfig(model_dir=str(base), num_kv_blocks=64, block_size=4,
                                      lora_modules=tuple((n, str(p)) for n, p in
                                                         adapters.items())))
    bm = BlockManager(runner.num_blocks, 4, enable_prefix_caching=False)
    seqs = {}
    for name in ADAPTERS:
        seq = Sequence(request_id=str(name), token_ids=list(PROMPTS["p0"]),
                       params=SamplingParams(), stop_token_ids=frozenset())
        if name is not None:
            seq.lora_id = runner.lora.lookup(name)
            seq.lora_slot = runner.lora.slots.acquire(seq.lora_id)
        seqs[name] = seq
    plan = [(seq, seq.num_tokens) for seq in seqs.values()]  # one prefill step, all three
    for _ in range(5):  # then decode steps, all three batched
        items = []
        for seq, n in plan:
            assert bm.allocate_slots(seq, n)
            items.append(ScheduledSeq(seq, n))
        step = runner.execute(items)
        for item, row in zip(step.sampling, step.sample, strict=True):
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            with torch.inference_mode():
                ref = references[None if seq.lora_id is None else seq.request_id](
                    torch.tensor([seq.token_ids])).logits[0, -1].float()
            torch.testing.assert_close(row, ref, atol=ATOL, rtol=0)
            seq.token_ids.append(int(ref.argmax()))
        plan = [(seq, 1) for seq in seqs.values()]


def test_scaling_follows_the_config(adapters: dict[str, Path]) -> None:
    assert read_config("qv", adapters["qv"])["scaling"] == 8 / 4
    assert read_config("all", adapters["all"])["scaling"] == pytest.approx(16 / 8**0.5)


# --- outputs --------------------------------------------------------------------------------


def test_greedy_alone_equals_peft_merged(solo: dict[str, list[int]], expected: dict) -> None:
    for rid, (prompt, adapter) in COMBOS.items():
        assert solo[rid] == expected[adapter, prompt], rid
    assert solo["qv-p0"] != solo["None-p0"] != solo["all-p0"]


def test_a_mixed_batch_gives_each_request_its_solo_output(
        base: Path, adapters: dict[str, Path], solo: dict[str, list[int]]) -> None:
    # A small token budget: chunked prefills of one adapter beside decodes of the others.
    core = make_core(base, adapters, max_num_batched_tokens=12)
    got, _ = run(core, COMBOS)
    assert got == solo


def test_lru_eviction_with_one_slot(base: Path, adapters: dict[str, Path],
                                    solo: dict[str, list[int]]) -> None:
    core = make_core(base, adapters, max_loras=1)
    assert core.runner.lora.slots.num_slots == 1
    got, _ = run(core, COMBOS)
    assert got == solo
    got, _ = run(core, {"a": ("p1", "all"), "b": ("p1", "qv"), "c": ("p2", "all")})
    assert got == {"a": solo["all-p1"], "b": solo["qv-p1"], "c": solo["all-p2"]}
    assert core.runner.lora.slots.num_loads >= 4  # swapped in and out, never two at once


def test_preemption_releases_and_retakes_slots(base: Path, adapters: dict[str, Path],
                                               solo: dict[str, list[int]]) -> None:
    # Few KV blocks: sequences are preempted (unpinning their adapter) and recomputed.
    core = make_core(base, adapters, max_loras=2, num_kv_blocks=20,
                     max_num_batched_tokens=16)
    got, _ = run(core, COMBOS)
    assert core.scheduler.num_preemptions > 0
    assert got == solo


def test_prefix_cache_hits_only_within_one_adapter(base: Path,
                                                   adapters: dict[str, Path]) -> None:
    core = make_core(base, adapters)
    order = [("base", None), ("qv", "qv"), ("qv-again", "qv"), ("all", "all"),
             ("base-again", None), ("all-again", "all")]
    cached = {}
    for rid, adapter in order:
        cached |= run(core, {rid: ("p2", adapter)})[1]
    assert cached["base"] == cached["qv"] == cached["all"] == 0
    assert cached["qv-again"] > 0 and cached["base-again"] > 0 and cached["all-again"] > 0


def test_an_unknown_adapter_fails_only_its_request(base: Path, adapters: dict[str, Path],
                                                   solo: dict[str, list[int]]) -> None:
    core = make_core(base, adapters)
    failed = core.add_request(AddRequest("bad", PROMPTS["p0"], GREEDY, lora_name="nope"))
    assert isinstance(failed, RequestFailed) and "'nope'" in failed.message
    plain = make_core(base, {})
    failed = plain.add_request(AddRequest("bad", PROMPTS["p0"], GREEDY, lora_name="qv"))
    assert isinstance(failed, RequestFailed) and "'qv'" in failed.message
    assert run(core, {"ok": ("p0", "qv")})[0] == {"ok": solo["qv-p0"]}


# --- what we refuse -------------------------------------------------------------------------


def _variant(src: Path, dst: Path, **changes: object) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "adapter_config.json").read_text())
    config.update(changes)
    (dst / "adapter_config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize(("changes", "reason"), [
    ({"use_dora": True}, "DoRA"),
    ({"bias": "all"}, "bias='all'"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"target_modules": ["embed_tokens", "q_proj"]}, "embedding targets"),
    ({"rank_pattern": {"q_proj": 2}}, "rank_pattern"),
    ({"peft_type": "IA3"}, "IA3"),
    ({"r": 2}, r"expected A \(2, 128\)"),
])
def test_unsupported_adapters_are_refused_by_name(base: Path, adapters: dict[str, Path],
                                                  tmp_path: Path, changes: dict,
                                                  reason: str) -> None:
    bad = _variant(adapters["qv"], tmp_path / "bad", **changes)
    with pytest.raises(LoraError, match=reason) as info:
        make_core(base, {"qv": adapters["qv"], "badly": bad})
    assert "'badly'" in str(info.value)


def test_rank_above_max_lora_rank_is_refused(base: Path, adapters: dict[str, Path]) -> None:
    with pytest.raises(LoraError, match=r"'all'.*rank 8 exceeds max_lora_rank 4"):
        make_core(base, adapters, max_lora_rank=4)


def test_an_embedding_weight_is_refused(base: Path, adapters: dict[str, Path],
                                        tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    bad = _variant(adapters["qv"], tmp_path / "emb")
    weights = load_file(bad / "adapter_model.safetensors")
    weights["base_model.model.model.embed_tokens.lora_embedding_A"] = torch.zeros(4, 2000)
    save_file(weights, bad / "adapter_model.safetensors")
    with pytest.raises(LoraError, match=r"'emb'.*unsupported weight .*embed_tokens"):
        targets = LoraTargets.of(Qwen3ForCausalLM, ModelConfig.from_dir(base))
        load_adapter("emb", bad, targets, None, torch.float32)


# --- runtime updates ------------------------------------------------------------------------


def test_runtime_load_and_unload(base: Path, adapters: dict[str, Path],
                                 solo: dict[str, list[int]], tmp_path: Path) -> None:
    core = make_core(base, {"qv": adapters["qv"]}, lora_runtime_updates=True)
    assert core.update_lora(LoadLora("1", "other", str(adapters["all"]))).error is None
    assert run(core, {"x": ("p1", "other")})[0] == {"x": solo["all-p1"]}
    bad = core.update_lora(LoadLora("2", "dora", str(_variant(adapters["qv"], tmp_path / "d",
                                                                use_dora=True))))
    assert "DoRA" in bad.error and core.runner.lora.lookup("dora") is None
    # Unloaded mid-generation: the running request finishes with it; new ones are refused.
    assert core.add_request(AddRequest("r", PROMPTS["p0"], GREEDY, lora_name="qv")) is None
    tokens = []
    for _ in range(3):
        tokens += [t for o in core.step() for t in o.new_token_ids]
    assert core.update_lora(UnloadLora("3", "qv")).error is None
    assert isinstance(core.add_request(AddRequest("s", PROMPTS["p0"], GREEDY,
                                                  lora_name="qv")), RequestFailed)
    while core.has_work:
        tokens += [t for o in core.step() for t in o.new_token_ids]
    assert tokens == solo["qv-p0"]
    assert core.update_lora(UnloadLora("4", "qv")).error == "LoRA adapter 'qv' is not loaded"
    # Loaded again under the same name: a new adapter, no prefix-cache hits from the old one.
    assert core.update_lora(LoadLora("5", "qv", str(adapters["qv"]))).error is None
    got, cached = run(core, {"t": ("p0", "qv")})
    assert got == {"t": solo["qv-p0"]} and cached["t"] == 0


def test_runtime_updates_are_off_by_default(base: Path, adapters: dict[str, Path]) -> None:
    core = make_core(base, adapters)
    assert "not enabled" in core.update_lora(LoadLora("1", "x", str(adapters["qv"]))).error


def test_stats_name_the_adapters_running_and_waiting(base: Path,
                                                     adapters: dict[str, Path]) -> None:
    """``lora_requests_info``'s source: with one slot, the second adapter's request waits."""
    core = make_core(base, adapters, max_loras=1)
    for rid, adapter in (("a", "all"), ("b", "qv"), ("c", None)):
        assert core.add_request(AddRequest(rid, PROMPTS["p1"], GREEDY,
                                           lora_name=adapter)) is None
    firsts = {out.request_id: out.first_token_timing for out in core.step()}
    stats = core.stats()
    assert (stats.running_loras, stats.waiting_loras) == (("all",), ("qv",))
    assert firsts["a"] is not None and min(firsts["a"]) >= 0  # queue and prefill seconds
    while core.has_work:
        core.step()
    stats = core.stats()
    assert stats.running_loras == stats.waiting_loras == ()
    assert sum(stats.iteration_tokens) == core.num_steps
    assert stats.iteration_tokens_sum >= stats.generation_tokens_total
