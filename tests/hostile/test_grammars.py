"""Hostile output constraints: each a 400 in OpenAI's shape, the server and its engine intact.

Schemas and grammars that overflowed llguidance's native stack in the HTTP process (which
took the whole server down with SIGSEGV), repetition counts that fail mid-generation, choice
lists that stalled the event loop, a grammar whose error was a Rust panic with a backtrace;
and a grammar worker killed under a job, which must fail that one request only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.hostile.conftest import (
    AUTH,
    MODEL,
    HostileServer,
    job_pipe_bytes,
    openai_error,
    stop_process,
    watched,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "hi"}]


def _post(server: HostileServer, body: dict, path: str = CHAT) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 4, **body}
    if path == CHAT:
        body.setdefault("messages", HI)
    else:
        body.setdefault("prompt", "hi")
    return httpx.post(server.base + path, json=body, headers=AUTH, timeout=60)


def ref_chain(n: int) -> dict:
    """``n`` definitions, each only a reference to the next."""
    defs: dict = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def object_chain(n: int) -> dict:
    """``n`` objects, each with one property of the next one's type (few refs, deep)."""
    defs: dict = {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}}
                  for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def nested(n: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(n):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def rule_chain(n: int, name: str = "r") -> str:
    return (f"start: {name}0\n" + "".join(f'{name}{i}: "a" {name}{i + 1}\n' for i in range(n))
            + f'{name}{n}: "x"\n')


LONG = "rule_of_a_long_chain_number_"  # 5,000 rules of it: ~300 KB
TOOL = {"type": "function", "function": {"name": "f", "parameters": ref_chain(5000)}}
FUNCTION = {"name": "f", "parameters": nested(40)}  # (a body nests 128 levels at most)

CASES = {
    "response_format 5,000 chained $refs": (
        {"response_format": {"type": "json_schema",
                             "json_schema": {"name": "x", "schema": ref_chain(5000)}}},
        CHAT, "response_format", "$refs"),
    "guided_json 5,000 chained $refs": (
        {"guided_json": ref_chain(5000)}, COMPLETIONS, "guided_json", "$refs"),
    "structured_outputs.json 300 chained objects": (
        {"structured_outputs": {"json": object_chain(300)}}, CHAT, "structured_outputs",
        "levels deep with its $refs followed"),
    "guided_json nested 80 deep": (
        {"guided_json": nested(40)}, COMPLETIONS, "guided_json", "nests deeper than 64"),
    "guided_json as a string, nested 80 deep": (
        {"guided_json": str(nested(40)).replace("'", '"')}, CHAT, "guided_json",
        "nests deeper than 64"),
    "guided_grammar 5,000 chained rules (~300 KB)": (
        {"guided_grammar": rule_chain(5000, LONG)}, COMPLETIONS, "guided_grammar",
        "too large"),
    "guided_grammar 5,000 chained rules": (
        {"guided_grammar": rule_chain(5000)}, CHAT, "guided_grammar", "rules"),
    "guided_grammar 400 chained rules": (
        {"guided_grammar": rule_chain(400)}, CHAT, "guided_grammar", "levels deep"),
    "guided_regex a{1000000}": (
        {"guided_regex": "a{1000000}"}, COMPLETIONS, "guided_regex", "1000000"),
    "structured_outputs.regex nested counts": (
        {"structured_outputs": {"regex": "((a{100}){100}){100}"}}, CHAT, "structured_outputs",
        "repeats too much"),
    "a schema pattern ^a{1000000}$": (
        {"guided_json": {"type": "object", "properties": {
            "s": {"type": "string", "pattern": "^a{1000000}$"}}}},
        COMPLETIONS, "guided_json", "pattern"),
    "a grammar's regex terminal": (
        {"guided_grammar": "start: /[0-9]{99999999999}/"}, CHAT, "guided_grammar",
        "repeats too much"),
    "a grammar's rule repetition": (
        {"guided_grammar": 'start: ("a" "b" "c" "d" "e" "f" "g"){10000}'}, CHAT,
        "guided_grammar", "repeats too much"),
    "a tool's parameters, 5,000 chained $refs": (
        {"tools": [TOOL], "tool_choice": "required"}, CHAT, "tools", "$refs"),
    "a legacy function's parameters, nested 80 deep": (
        {"functions": [FUNCTION], "function_call": {"name": "f"}}, CHAT, "functions",
        "nests deeper"),
    "tools together over the size bound": (
        {"tools": [{"type": "function", "function": {
            "name": f"f{i}", "parameters": {"type": "object", "properties": {
                f"p{j}": {"type": "string", "description": "d" * 200} for j in range(100)}}}}
            for i in range(20)], "tool_choice": "required"}, CHAT, "tools", "together"),
    "guided_choice 100,000 strings": (
        {"guided_choice": [f"choice-{i}" for i in range(100_000)]}, COMPLETIONS,
        "guided_choice", "100000 choices"),
    "structured_outputs.choice 5,000 strings": (
        {"structured_outputs": {"choice": [f"c{i}" for i in range(5000)]}}, CHAT,
        "structured_outputs", "choices"),
    "structured_outputs.choice too long together": (
        {"structured_outputs": {"choice": ["x" * 100_000, "y" * 100_000, "z" * 100_000]}},
        CHAT, "structured_outputs", "too long together"),
}


@pytest.mark.timing
@pytest.mark.parametrize("case", list(CASES))
def test_over_a_bound_is_a_400_naming_the_field(hostile_server: HostileServer,
                                                case: str) -> None:
    body, path, param, fragment = CASES[case]
    with watched(hostile_server):
        started = time.monotonic()
        error = openai_error(_post(hostile_server, body, path), 400)
        assert time.monotonic() - started < 5
    assert error["param"] == param, error
    assert fragment in error["message"], error["message"]
    assert "limit" in error["message"], error["message"]


def test_a_grammar_the_library_cannot_build_is_a_plain_400(hostile_server: HostileServer
                                                          ) -> None:
    """70,000 literals in a row, under every bound: llguidance panics (its symbol table
    overflows) and its error is the panic's text and a native backtrace with build paths.
    The client reads what is wrong, no more."""
    with watched(hostile_server):
        r = _post(hostile_server, {"guided_grammar": "start: " + '"a"' * 70_000}, COMPLETIONS)
        error = openai_error(r, 400)
    assert error["param"] == "guided_grammar"
    assert "too large or too complex" in error["message"], error["message"]
    for leak in ("panic", "backtrace", "assert", "u16::", "python-build", "<unknown>"):
        assert leak not in error["message"], error["message"]
    assert len(error["message"]) < 700


def test_invalid_grammars_still_say_what_is_wrong(hostile_server: HostileServer) -> None:
    with watched(hostile_server):
        for body, fragment in (({"guided_grammar": "start: <nosuchtoken>"}, "nosuchtoken"),
                               ({"guided_regex": "[a-"}, "regex"),
                               ({"guided_json": {"type": "nope"}}, "nope")):
            error = openai_error(_post(hostile_server, body, COMPLETIONS), 400)
            assert fragment in error["message"], error
            assert len(error["message"]) <= 700


def test_constraints_under_the_bounds_still_generate(hostile_server: HostileServer) -> None:
    with watched(hostile_server):
        for body in ({"guided_choice": [f"c{i}" for i in range(4096)]},
                     {"guided_regex": "[a-z]{1,3}\\d{2}"},
                     {"guided_json": object_chain(60)},
                     {"guided_grammar": rule_chain(200)}):
            r = _post(hostile_server, {**body, "max_tokens": 600}, COMPLETIONS)
            assert r.status_code == 200, (body, r.text[:300])


def _grammar_workers(server_pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{server_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"grammar_worker" in cmdline:
                found.append(int(child))
    return found


@pytest.mark.timing
def test_a_worker_that_dies_under_a_job_fails_that_request_only(
        hostile_server: HostileServer) -> None:
    """The worker is stopped with the job in its pipe, then dies of SIGSEGV (as a native
    stack overflow kills it): that request is a 400; meanwhile plain requests and /health
    are served; afterwards a fresh worker compiles the next grammar."""
    choice = {"guided_choice": ["yes", "no"]}
    with watched(hostile_server):
        assert _post(hostile_server, choice).status_code == 200  # a worker is up
        workers = _grammar_workers(hostile_server.pid)
        assert workers
        for pid in workers:
            stop_process(pid)
        try:
            with ThreadPoolExecutor(1) as pool:
                doomed = pool.submit(_post, hostile_server, {"guided_regex": "[a-z]{3}"})
                deadline = time.monotonic() + 30  # a state, not a delay: the job has
                while not any(job_pipe_bytes(pid) for pid in workers):  # been sent
                    assert time.monotonic() < deadline and not doomed.done()
                    time.sleep(0.01)
                assert not doomed.done()
                plain = _post(hostile_server, {})  # no constraint: nothing to wait for
                assert plain.status_code == 200, plain.text
                for pid in workers:
                    os.kill(pid, signal.SIGSEGV)  # pending while stopped, fatal once resumed
                    os.kill(pid, signal.SIGCONT)
                error = openai_error(doomed.result(), 400)
        finally:
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        assert error["param"] == "guided_regex"
        assert "could not be compiled" in error["message"], error
        after = _post(hostile_server, choice)
        assert after.status_code == 200, after.text
        assert after.json()["choices"][0]["message"]["content"] in ("yes", "no")
        assert set(_grammar_workers(hostile_server.pid)).isdisjoint(workers)
    log = hostile_server.new_log()
    assert log.count("while compiling a request's grammar") == 1, log[-3000:]
    assert "killed by SIGSEGV" in log
