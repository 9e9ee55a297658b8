"""The engine's CPU threads follow the step and the machine: every core for a burst of
prompts; for decode steps every core while the rest of the machine is nearly idle, one left
free while it is not; a hand-set count is never changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from izh_trio.engine import cpu_load
from izh_trio.engine.core import EngineCore
from izh_trio.engine.cpu_load import OtherLoad
from izh_trio.engine.scheduler import ScheduledSeq
from izh_trio.engine.sequence import Sequence
from izh_trio.engine.thread_plan import (
    GATHER_ABOVE,
    PREFILL_TOKENS_MAX,
    SPREAD_BELOW,
    SPREAD_MIN_WEIGHT_BYTES,
    StepTimes,
    ThreadPlan,
    prefill_tokens,
)
from izh_trio.wire import AddRequest, EngineConfig, SamplingParams


class FakeMachine:
    """``/proc`` as a test sets it: the machine's and this process's busy seconds, a clock."""

    def __init__(self) -> None:
        self.now = 100.0
        self.machine = 1000.0
        self.own = 10.0

    def run(self, seconds: float, others: float, own: float = 1.0) -> None:
        """``seconds`` pass, the rest of the machine busy on ``others`` cores."""
        self.now += seconds
        self.machine += seconds * (others + own)
        self.own += seconds * own

    def load(self) -> OtherLoad:
        return OtherLoad(window=0.25, machine=lambda: self.machine, own=lambda: self.own,
                         clock=lambda: self.now)


def _core(model_dir: Path, **cfg: object) -> EngineCore:
    return EngineCore(EngineConfig(model_dir=str(model_dir), num_kv_blocks=64, **cfg))


def _burst(core: EngineCore, n: int, prompt_len: int) -> None:
    for i in range(n):
        core.add_request(AddRequest(f"r{i}", [(7 * i + j) % 1900 + 50 for j in range(prompt_len)],
                                    SamplingParams(max_tokens=3, ignore_eos=True)))


@pytest.fixture
def threads_kept():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_load_is_the_machine_less_this_process() -> None:
    fake = FakeMachine()
    load = fake.load()
    assert load.update() is None  # no window has passed yet
    fake.run(0.1, others=0.5)
    assert load.update() is None  # still within the first window
    fake.run(0.2, others=0.5)
    assert load.update() == pytest.approx(0.5)
    fake.run(0.3, others=0.0, own=2.0)  # this process's own threads do not count
    assert load.update() == pytest.approx(0.0)
    fake.run(0.1, others=1.5)
    assert load.update() == pytest.approx(0.0)  # read at most once a window


def test_a_reading_after_a_pause_starts_a_new_window() -> None:
    fake = FakeMachine()
    load = fake.load()
    load.update()
    fake.run(0.3, others=0.1)
    assert load.update() == pytest.approx(0.1)
    # the engine waits 20 s for work while something else keeps both cores busy
    load.pause()
    fake.run(20.0, others=2.0, own=0.0)
    assert load.update() == pytest.approx(0.1)  # the last figure, not the pause's 2.0
    fake.run(0.3, others=0.2)
    assert load.update() == pytest.approx(0.2)  # a fresh window from the first reading
    fake.run(3.0, others=1.5, own=2.0)  # without a pause, a long stretch is a window too
    assert load.update() == pytest.approx(1.5)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to spread over")
def test_the_engine_pauses_its_load_reading_when_it_goes_idle(
        hf_dir: Path, threads_kept: None) -> None:
    core = _core(hf_dir, device="cpu")
    fake = FakeMachine()
    core.threads.load = fake.load()
    core.threads.load.update()
    fake.run(0.3, others=0.0)
    core.add_request(AddRequest("a", [60, 61, 62], SamplingParams(max_tokens=4, ignore_eos=True)))
    while core.has_work:
        core.step()
    assert core.threads.spread  # an idle machine: decode steps may take every core
    core.idle()  # as the engine's loop does before it waits
    fake.run(30.0, others=2.0, own=0.0)  # another server's run meanwhile
    core.add_request(AddRequest("b", [60, 61, 62], SamplingParams(max_tokens=4, ignore_eos=True)))
    core.step()
    # the pause's reading is not taken for the load: decode steps may still take every core
    assert core.threads.spread and core.threads.load.cores == pytest.approx(0.0)


def test_unknown_load_is_none() -> None:
    load = OtherLoad(machine=lambda: None)
    assert load.update() is None and load.update() is None


def test_proc_readers_count_this_process() -> None:
    if cpu_load.machine_busy_seconds() is None:
        pytest.skip("no /proc/stat here")
    own0, machine0 = cpu_load.own_busy_seconds(), cpu_load.machine_busy_seconds()
    x = 0
    for i in range(3_000_000):  # some CPU of our own, which the machine counts too
        x += i
    own1, machine1 = cpu_load.own_busy_seconds(), cpu_load.machine_busy_seconds()
    assert own0 is not None and own1 is not None and machine0 is not None
    assert machine1 is not None and own1 > own0 and machine1 - machine0 >= own1 - own0 - 0.05


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to spread over")
def test_decode_may_spread_on_an_idle_machine_and_leaves_a_core_to_a_busy_one(
        hf_dir: Path, threads_kept: None) -> None:
    core = _core(hf_dir, device="cpu")
    cores = os.cpu_count() or 2
    assert (core.threads.decode, core.threads.prefill) == (cores - 1, cores)
    fake = FakeMachine()
    core.threads.load = fake.load()  # as a large model's plan has
    _burst(core, 8, 40)  # 320 prompt tokens in the first step: every core, whatever the load
    core.step()
    assert torch.get_num_threads() == cores
    core.step()  # decode only: the load is not known yet, so a core stays free
    assert torch.get_num_threads() == cores - 1 and not core.threads.spread
    fake.run(0.3, others=SPREAD_BELOW / 2)
    core.add_request(AddRequest("late", [60, 61, 62], SamplingParams(max_tokens=40,
                                                                     ignore_eos=True)))
    used = set()
    while core.has_work:  # an idle machine: both counts are tried, and timed
        core.step()
        used.add(torch.get_num_threads())
    assert core.threads.spread and used == {cores - 1, cores}
    assert {count for _, count in core.threads.times.recent} == {cores - 1, cores}
    fake.run(0.3, others=GATHER_ABOVE * 2)  # a busy frontend
    core.add_request(AddRequest("busy", [60, 61, 62], SamplingParams(max_tokens=12,
                                                                     ignore_eos=True)))
    core.step()
    while core.has_work:
        core.step()
        assert torch.get_num_threads() == cores - 1
    assert not core.threads.spread
    fake.run(0.3, others=(SPREAD_BELOW + GATHER_ABOVE) / 2)  # between the lines: kept
    core.add_request(AddRequest("mid", [60, 61, 62], SamplingParams(max_tokens=3)))
    core.step()
    assert not core.threads.spread


def test_step_times_pick_the_faster_count_per_batch_size() -> None:
    """Fed directly (every step counted): the tries, then the faster with explorations (the
    other measured afresh: three steps), rarer once the other is far behind."""
    times = StepTimes(explore_every=10, far_every=20)
    speed = {1: 0.050, 2: 0.055}  # one thread a little faster
    chosen = []
    for _ in range(40):
        count = times.choose(1, (1, 2))
        times.observe(1, count, speed[count])
        chosen.append(count)
    assert chosen[:6] == [1, 1, 1, 2, 2, 2]  # each tried until it has its samples
    # then the faster; the slower once its figures are 10 steps old, until it has three new
    assert chosen[6:] == [1] * 9 + [2] * 3 + [1] * 9 + [2] * 3 + [1] * 9 + [2]
    # Another batch size learns on its own, and the machine may change its mind; the other
    # count, 1.6x slower there, is re-tried every 20th step only.
    speed = {1: 0.144, 2: 0.090}
    chosen = []
    for _ in range(45):
        count = times.choose(4, (1, 2))
        times.observe(4, count, speed[count])
        chosen.append(count)
    assert chosen[6:].count(1) == 4  # its 23rd-25th and 45th steps
    # the first bucket's 40th step began an exploration: 41 and 42 end it, 43-49 run the
    # faster again
    chosen = []
    for _ in range(9):
        count = times.choose(1, (1, 2))
        times.observe(1, count, {1: 0.050, 2: 0.055}[count])
        chosen.append(count)
    assert chosen == [2] * 2 + [1] * 7


def test_one_slow_step_does_not_hand_over_the_bucket() -> None:
    """A step three times its usual length (the frontend took the core, a page fault) leaves
    the faster count in place; a lasting change moves the choice within a few steps."""
    times = StepTimes(explore_every=64, far_every=64)
    speed = {1: 0.060, 2: 0.040}
    for _ in range(10):
        count = times.choose(1, (1, 2))
        times.observe(1, count, speed[count])
    assert times.choose(1, (1, 2)) == 2
    times.observe(1, 2, 0.120)
    assert [times.choose(1, (1, 2)) for _ in range(20)] == [2] * 20
    for _ in range(StepTimes.WINDOW // 2 + 1):  # two threads got slower for good
        times.observe(1, 2, 0.080)
    assert times.choose(1, (1, 2)) == 1


def test_a_slow_stretch_is_forgotten_at_the_next_exploration() -> None:
    """Four slow steps in a row on two threads (something else took the machine) fill most of
    their window and hand the bucket to one thread, the slower as soon as the burst is over.
    At two threads' next exploration their figures are measured afresh, not topped up by a
    step, so they take the bucket back then, not four explorations later."""
    times = StepTimes(explore_every=16, far_every=32)
    speed = {1: 0.056, 2: 0.046}
    for _ in range(10):
        count = times.choose(4, (1, 2))
        times.observe(4, count, speed[count])
    for slow in (0.131, 0.116, 0.082, 0.082):
        assert times.choose(4, (1, 2)) == 2
        times.observe(4, 2, slow)
    chosen = []
    for _ in range(40):  # the bucket's steps 15 to 54
        count = times.choose(4, (1, 2))
        times.observe(4, count, speed[count])
        chosen.append(count)
    # one thread from step 15; two again from step 46 on, when their figures are 32 steps
    # old (the first far exploration)
    assert chosen == [1] * 31 + [2] * 9


def test_a_batch_size_met_only_after_a_change_of_count_still_learns() -> None:
    """Waves of eight streams that end a step apart: each wave is eight-sequence steps, then
    one seven-sequence step (another bucket), which on one thread always follows a
    two-thread step. Its first such step teaches nothing, the later ones do, so the bucket
    ends its tries and settles on the faster count instead of trying one thread forever."""
    plan = ThreadPlan(1, 2)
    plan.spread = True  # an idle machine: decode steps choose their count
    times = plan.times
    speed = {8: {1: 0.080, 2: 0.045}, 7: {1: 0.065, 2: 0.042}}
    now, seven = 0, []

    def step(rows: int) -> int:
        nonlocal now
        batch = [ScheduledSeq(Sequence(f"d{i}", [1, 2], SamplingParams(), frozenset()), 1)
                 for i in range(rows)]
        count = times.choose(rows.bit_length(), (1, 2))
        plan.observe(batch, count, speed[rows][count], switched=count != now)
        now = count
        return count

    for _ in range(12):
        for _ in range(20):
            step(8)
        seven.append(step(7))
    assert seven[:4] == [1] * 4  # the first left out, then three samples
    assert seven[4:7] == [2] * 3  # no change of count from the eight-sequence steps
    assert seven[7:] == [2] * 5
    assert len(times.recent[3, 1]) == StepTimes.SAMPLES


def test_only_decode_steps_on_an_idle_machine_teach_the_times() -> None:
    plan = ThreadPlan(1, 2)
    decode = [ScheduledSeq(Sequence("d", [1, 2], SamplingParams(), frozenset()), 1)]
    plan.observe(decode, 1, 0.5, switched=False)
    assert not plan.times.recent  # not spread: nothing to choose between
    plan.spread = True
    plan.observe(decode, 1, 0.5, switched=True)  # the first step after a change of count
    mixed = [*decode, ScheduledSeq(Sequence("p", [1, 2, 3], SamplingParams(), frozenset()), 3)]
    plan.observe(mixed, 1, 0.5, switched=False)
    assert not plan.times.recent
    plan.observe(decode, 1, 0.5, switched=False)
    assert {key: len(v) for key, v in plan.times.recent.items()} == {(1, 1): 1}


def test_hand_set_threads_are_kept(hf_dir: Path, threads_kept: None) -> None:
    core = _core(hf_dir, device="cpu", num_threads=1)
    assert (core.threads.decode, core.threads.prefill, core.threads.load) == (1, 1, None)
    _burst(core, 8, 40)
    while core.has_work:
        core.step()
        assert torch.get_num_threads() == 1


def test_plan_without_a_load_keeps_a_core_free() -> None:
    plan = ThreadPlan(1, 2)
    assert plan.for_batch([]) == 1


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to spread over")
def test_only_a_large_model_spreads(hf_dir: Path) -> None:
    config = EngineConfig(model_dir=str(hf_dir))
    assert ThreadPlan.for_config(config, SPREAD_MIN_WEIGHT_BYTES - 1).load is None
    assert ThreadPlan.for_config(config, SPREAD_MIN_WEIGHT_BYTES).load is not None
    core = _core(hf_dir, device="cpu")  # the test checkpoint: a few MB
    assert core.threads.load is None


def test_checkpoint_bytes_decide_before_torch_loads(tmp_path: Path, hf_dir: Path) -> None:
    """The engine process lets OpenMP workers spin (no GOMP_SPINCOUNT) only for a model large
    enough to spread, judged from its weight files before torch is imported."""
    from izh_trio.engine.cpu_load import checkpoint_bytes

    assert 0 < checkpoint_bytes(str(hf_dir)) < SPREAD_MIN_WEIGHT_BYTES
    with open(tmp_path / "model-00001-of-00002.safetensors", "wb") as f:
        f.truncate(SPREAD_MIN_WEIGHT_BYTES // 2)  # sparse: sizes, not contents, are read
    with open(tmp_path / "model-00002-of-00002.safetensors", "wb") as f:
        f.truncate(SPREAD_MIN_WEIGHT_BYTES // 2)
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_bytes(str(tmp_path)) == SPREAD_MIN_WEIGHT_BYTES
    assert checkpoint_bytes(str(tmp_path / "missing")) == 0


def test_a_large_model_takes_every_core_for_a_few_prompt_tokens() -> None:
    """A prompt token of a large model is tens of milliseconds of arithmetic: a step with a
    few takes every core, however busy the machine; a small model's needs a burst."""
    assert prefill_tokens(10 << 20) == PREFILL_TOKENS_MAX  # the tiny benchmark model
    assert prefill_tokens(1200 << 20) <= 4 and prefill_tokens(1 << 40) == 1
    plan = ThreadPlan(1, 2, prefill_tokens(1200 << 20))
    prompt = ScheduledSeq(Sequence("p", list(range(32)), SamplingParams(), frozenset()), 32)
    decode = ScheduledSeq(Sequence("d", [1, 2], SamplingParams(), frozenset()), 1)
    assert plan.for_batch([decode, prompt]) == 2 and plan.for_batch([decode]) == 1
    assert ThreadPlan(1, 2, prefill_tokens(10 << 20)).for_batch([decode, prompt]) == 1
