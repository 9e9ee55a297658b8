"""The grammar workers, driven directly: a grammar that crashes llguidance (a stack overflow,
past the bounds the routes check first) kills a worker and fails that job alone; a job over
its time bound, or one whose request is cancelled, takes its worker down too; the next job
gets a fresh one; a worker compiles as the engine does, and never imports torch.

A job that must still be running when its bound or its cancellation comes is held by a
stopped worker (SIGSTOP), not by a grammar slow to compile: no machine is fast enough to
answer from a stopped process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import llguidance
import pytest
import trio

from izh_trio.frontend.grammar_pool import (
    GrammarCrashed,
    GrammarPool,
    GrammarTimeout,
    PoolSettings,
    WorkerSpec,
    job_stack_bytes,
)
from izh_trio.frontend.structured import choice_grammar, json_schema_grammar
from tests.hostile.conftest import queued_bytes, stop_process

OK = choice_grammar(["yes", "no"], "x")


@pytest.fixture(scope="module")
def spec(tiny_dir: Path) -> WorkerSpec:
    config = json.loads((tiny_dir / "config.json").read_text())
    eos = config["eos_token_id"]
    return WorkerSpec(tiny_dir / "tokenizer.json", config["vocab_size"],
                      (eos,) if isinstance(eos, int) else eos)


def ref_chain_grammar(n: int) -> str:
    """Past the bounds on purpose: written by llguidance itself, never checked."""
    defs: dict = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return llguidance.LLMatcher.grammar_from_json_schema({"$ref": "#/$defs/d0", "$defs": defs})


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_a_crashing_grammar_fails_alone_and_a_fresh_worker_follows(
        spec: WorkerSpec, caplog: pytest.LogCaptureFixture) -> None:
    pool = GrammarPool(lambda: spec)
    try:
        assert await pool.check(OK) is None
        (first,) = pool._idle
        with pytest.raises(GrammarCrashed, match="SIGSEGV"):
            await pool.check(ref_chain_grammar(5000))
        assert pool.crashes == 1 and not alive(first.process.pid)
        assert await pool.check(OK) is None
        assert await pool.check("start: <nosuchtoken>")  # an error, not a crash
    finally:
        await pool.aclose()
    crashes = [r for r in caplog.records if "while compiling" in r.getMessage()]
    assert len(crashes) == 1 and crashes[0].levelname == "WARNING"
    assert crashes[0].exc_info is None


@pytest.mark.timing
async def test_a_job_over_its_time_bound_kills_its_worker(spec: WorkerSpec) -> None:
    pool = GrammarPool(lambda: spec, PoolSettings(job_timeout=0.2))
    try:
        assert await pool.check(OK) is None
        (worker,) = pool._idle
        stop_process(worker.process.pid)  # it will never answer
        started = trio.current_time()
        with trio.fail_after(30), pytest.raises(GrammarTimeout):  # fail_after: against a hang
            await pool.check(OK)
        assert trio.current_time() - started >= 0.2  # the bound ended it, nothing sooner
        assert not alive(worker.process.pid)
        assert await pool.check(OK) is None
    finally:
        await pool.aclose()


@pytest.mark.timing
async def test_a_cancelled_job_kills_its_worker_and_leaves_no_process(spec: WorkerSpec
                                                                      ) -> None:
    pool = GrammarPool(lambda: spec)
    try:
        assert await pool.check(OK) is None
        (worker,) = pool._idle
        stop_process(worker.process.pid)  # it holds the job until the cancel
        scope = trio.CancelScope()

        async def job() -> None:
            with scope:
                await pool.check(OK)
                raise AssertionError("a stopped worker answered")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(job)
            with trio.fail_after(30):  # until the job is in the worker's pipe: a state
                while not queued_bytes(worker.to_worker.fileno()):
                    await trio.sleep(0.01)
            scope.cancel()
        assert scope.cancelled_caught
        assert not alive(worker.process.pid) and not pool._idle
        assert await pool.check(OK) is None
    finally:
        await pool.aclose()
    assert not any(alive(w.process.pid) for w in pool._idle)


async def test_two_workers_serve_two_jobs_at_once(spec: WorkerSpec) -> None:
    pool = GrammarPool(lambda: spec)
    results: list[str | None] = []
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(lambda: _append(results, pool.check(OK)))
        assert results == [None] * 4 and len(pool._idle) == 2
    finally:
        await pool.aclose()


async def _append(results: list, job: object) -> None:
    results.append(await job)  # type: ignore[misc]


async def test_workers_compile_as_the_engine_does(spec: WorkerSpec) -> None:
    """The verdicts are the engine's own construction's: GuidedDecoding.add refuses what a
    worker refuses, and accepts what it accepts."""
    from izh_trio.engine.guided import GuidedDecoding

    engine = GuidedDecoding(spec.tokenizer_path, spec.vocab_size, spec.eos_token_ids)
    grammars = [OK, "start: <nosuchtoken>", '{"grammars": [{"lark_grammar": "start: /[a-/"}]}',
                json_schema_grammar({"type": "object", "properties": {"a": {"type": "integer"}}},
                                    "x"),
                "start: " + '"a"' * 70_000, "start: <|endoftext|>"]
    pool = GrammarPool(lambda: spec)
    try:
        for i, grammar in enumerate(grammars):
            verdict = await pool.check(grammar)
            refused = engine.add(f"r{i}", grammar, max_tokens=10**6)
            engine.forget(f"r{i}")
            assert (verdict is None) == (refused is None), (grammar[:60], verdict, refused)
    finally:
        await pool.aclose()


def test_the_worker_imports_no_torch_and_no_trio() -> None:
    code = ("import sys, izh_trio.frontend.grammar_worker as w, llguidance; "
            "print(sorted(m for m in ('torch', 'trio', 'quart') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.strip() == "[]", out


def test_jobs_run_on_half_the_engines_stack() -> None:
    assert job_stack_bytes() <= 4 << 20
    assert job_stack_bytes() >= 1 << 20


async def test_closing_the_pool_stops_its_workers(spec: WorkerSpec) -> None:
    pool = GrammarPool(lambda: spec)
    assert await pool.check(OK) is None
    pids = [w.process.pid for w in pool._idle]
    await pool.aclose()
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        await trio.sleep(0.02)
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize(("document", "field", "size", "kind"), [
    ({"prompt": "x" * 11, "n": 1}, "prompt", 11, "text"),
    ({"messages": [{"role": "user", "content": [{"text": "é" * 12}]}]}, "messages", 12,
     "text"),
    ({"tools": [{"k" * 13: 1}]}, "tools", 13, "text"),  # a key counts too
    ({"prompt": [1] * 6}, "prompt", 6, "array"),
    ({"model": "m", "messages": [{str(i): 1 for i in range(7)}]}, "messages", 7, "array"),
    ({"prompt": "x" * 10, "messages": [[1] * 5]}, None, None, None),  # at the bounds
    ({"user": "y" * 14, "logit_bias": {str(i): 1 for i in range(9)}}, None, None, None),
    (["y" * 14], None, None, None),  # not a request: no field is bounded
])
async def test_a_parse_job_reports_an_overlong_value_instead_of_it(
        spec: WorkerSpec, document: object, field: str | None, size: int | None,
        kind: str | None) -> None:
    """In a field whose content goes into the prompt, a string longer than any text the
    context can hold, or an array of more members than it has tokens, never comes back to the
    event loop (decoding megabytes there stalls it): the worker names the field instead.
    Other fields come back whole."""
    pool = GrammarPool(lambda: spec)
    try:
        data = json.dumps(document, ensure_ascii=False).encode()
        parsed = await pool.parse_json([data[:7], data[7:]], ("prompt", "messages", "tools"),
                                       longest=10, most_items=5)
    finally:
        await pool.aclose()
    assert parsed.error is None
    if size is None:
        assert (parsed.value, parsed.too_long) == (document, None)
    else:
        assert (parsed.value, parsed.field, parsed.too_long, parsed.too_long_kind) == (
            None, field, size, kind)
