"""Big inputs: refused by their size before tokenizing, worked on off the event loop, and the
memory they took given back.

A 30 MB prompt used to be tokenized on the event loop: its 400 came after ~24 s, /health
waited as long, and the HTTP process grew to ~2.9 GB and kept ~1.1 GB.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import engine_pid
from tests.hostile.conftest import (
    AUTH,
    MODEL,
    HostileServer,
    openai_error,
    wait_idle,
    watched,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
BIG = "hello world " * (30_000_000 // 12)  # 30 MB, under the 32 MiB body limit
#: Both processes' RSS after big and many requests, against their idle RSS (the issue's).
RSS_TOLERANCE = 0.20


def _encoded(body: dict) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()


def _post(server: HostileServer, path: str, body: dict | bytes,
          timeout: float = 120) -> httpx.Response:
    """POST JSON; a big body is best encoded before the watch begins (``_encoded``): the
    watching thread shares this process's GIL, which encoding 30 MB holds for tens of ms."""
    content = body if isinstance(body, bytes) else _encoded(body)
    return httpx.post(server.base + path, content=content, timeout=timeout,
                      headers={**AUTH, "Content-Type": "application/json"})


def _by_size(r: httpx.Response) -> dict:
    """A context_length_exceeded 400 decided by the prompt's size, without tokenizing it."""
    error = openai_error(r, 400)
    assert error["code"] == "context_length_exceeded", error
    assert "without tokenizing" in error["message"], error["message"]
    return error


@pytest.mark.parametrize(("path", "body", "param"), [
    (COMPLETIONS, {"model": MODEL, "prompt": BIG, "max_tokens": 4}, "prompt"),
    (COMPLETIONS, {"model": MODEL, "prompt": ["hi", BIG], "max_tokens": 4}, "prompt"),
    (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": BIG}]}, "messages"),
    (CHAT, {"model": MODEL, "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "é" * 15_000_000}]}]},
     "messages"),
    ("/tokenize", {"model": MODEL, "prompt": BIG}, "prompt"),
    ("/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": BIG}]},
     "messages"),
], ids=["completions", "completions-batch", "chat", "chat-non-ascii-part", "tokenize",
        "tokenize-messages"])
def test_a_30mb_prompt_is_refused_by_its_size(hostile_server: HostileServer, path: str,
                                              body: dict, param: str) -> None:
    content = _encoded(body)
    with watched(hostile_server):
        error = _by_size(_post(hostile_server, path, content))
        assert error["param"] == param, error


def test_a_prompt_of_millions_of_token_ids_is_refused_by_its_size(
        hostile_server: HostileServer) -> None:
    """21 MB of token ids: read, checked and refused in the parse worker; decoded and
    validated on the event loop, they held it for ~0.9 s."""
    content = _encoded({"model": MODEL, "prompt": [5] * 7_000_000, "max_tokens": 4})
    with watched(hostile_server):
        error = openai_error(_post(hostile_server, COMPLETIONS, content), 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt", error
    assert "7000000 members" in error["message"], error


def test_a_huge_conversation_is_refused_before_rendering(hostile_server: HostileServer) -> None:
    """The messages' text together proves it: no turn alone is too long."""
    turn = "hello world " * (40_000 // 12)  # under the bound (tens of KB here)
    content = _encoded({"model": MODEL, "messages": [
        {"role": ("user", "assistant")[i % 2], "content": turn} for i in range(99)]})
    with watched(hostile_server):
        _by_size(_post(hostile_server, CHAT, content))


def test_a_prompt_under_the_size_bound_is_tokenized_off_the_loop(
        hostile_server: HostileServer) -> None:
    """Tens of KB of text the size cannot judge: tokenized in a worker, then refused for its
    token count as before, while /health answers."""
    rng = random.Random(0)
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz .,;!?0123456789")
                   for _ in range(60_000))
    with watched(hostile_server):
        for path, body in ((COMPLETIONS, {"model": MODEL, "prompt": text, "max_tokens": 4}),
                           (CHAT, {"model": MODEL, "max_tokens": 4,
                                   "messages": [{"role": "user", "content": text}]})):
            error = openai_error(_post(hostile_server, path, body), 400)
            assert error["code"] == "context_length_exceeded", error
            assert "without tokenizing" not in error["message"], error
        r = _post(hostile_server, "/tokenize", {"model": MODEL, "prompt": text,
                                                "return_token_strs": True})
        assert r.status_code == 200, r.text
        assert r.json()["count"] > r.json()["max_model_len"]
        assert len(r.json()["token_strs"]) == r.json()["count"]


def _conversation(turns: int) -> list[dict]:
    """Short turns, many: over the inline limit by their count (~40 tokens a turn here)."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: ok"}
            for i in range(turns)]


#: ~5 KB of text in few tokens (this tokenizer has a 32-character "=" token).
FITTING_PROMPT = "".join("=" * 64 + f" word{i} " for i in range(70))


def test_big_inputs_that_fit_are_answered_as_small_ones_are(
        hostile_server: HostileServer) -> None:
    """Worked on in a worker thread, a prompt gets the tokens it gets inline."""
    turns = _conversation(121)
    with watched(hostile_server):
        tokens = _post(hostile_server, "/tokenize", {"model": MODEL, "messages": turns})
        assert tokens.status_code == 200, tokens.text
        r = _post(hostile_server, CHAT, {"model": MODEL, "messages": turns, "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == tokens.json()["count"]
        # Inline, turn by turn, the conversation's tokens are the same, a prefix at a time.
        small = _post(hostile_server, "/tokenize", {"model": MODEL, "messages": turns[:3],
                                                    "add_generation_prompt": False})
        assert small.status_code == 200, small.text
        assert tokens.json()["tokens"][:small.json()["count"]] == small.json()["tokens"]

        prompt_tokens = _post(hostile_server, "/tokenize",
                              {"model": MODEL, "prompt": FITTING_PROMPT})
        assert prompt_tokens.status_code == 200, prompt_tokens.text
        r = _post(hostile_server, COMPLETIONS, {"model": MODEL, "prompt": FITTING_PROMPT,
                                                "max_tokens": 2, "echo": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == prompt_tokens.json()["count"]
        assert r.json()["choices"][0]["text"].startswith(FITTING_PROMPT)
        ids = prompt_tokens.json()["tokens"]
        r = _post(hostile_server, COMPLETIONS, {"model": MODEL, "prompt": ids,
                                                "max_tokens": 2, "echo": True})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"].startswith(FITTING_PROMPT)
        back = _post(hostile_server, "/detokenize", {"model": MODEL, "tokens": ids * 13})
        assert back.status_code == 200, back.text
        assert back.json()["prompt"] == FITTING_PROMPT * 13


def test_a_guided_choice_of_100k_strings_does_not_stall_the_server(
        hostile_server: HostileServer) -> None:
    with watched(hostile_server):
        r = _post(hostile_server, CHAT, {
            "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "pick"}],
            "guided_choice": [f"choice-{i}" for i in range(100_000)]})
        if r.status_code != 200:
            openai_error(r, r.status_code)
            assert 400 <= r.status_code < 500, r.text


# ---------------------------------------------------------------- memory


def _rss(pid: int) -> int:
    """Resident memory in bytes (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _mixed(base: str) -> Callable[[int], int]:
    """Request ``i`` of a mixed load: chat and completions, streamed and not, /tokenize, a
    big-ish prompt (worker path) and errors; returns the status."""
    chat = base + CHAT
    completions = base + COMPLETIONS

    def one(i: int) -> int:
        kind = i % 8
        with httpx.Client(headers=AUTH, timeout=120) as client:
            if kind == 0:
                r = client.post(chat, json={"model": MODEL, "max_tokens": 4, "messages": [
                    {"role": "user", "content": f"hello {i}"}]})
            elif kind == 1:
                with client.stream("POST", chat, json={
                        "model": MODEL, "max_tokens": 4, "stream": True,
                        "stream_options": {"include_usage": True},
                        "messages": [{"role": "user", "content": f"hey {i}"}]}) as r:
                    r.read()
            elif kind == 2:
                r = client.post(completions, json={"model": MODEL, "max_tokens": 4,
                                                   "prompt": f"once upon a time {i}"})
            elif kind == 3:
                with client.stream("POST", completions, json={
                        "model": MODEL, "max_tokens": 4, "stream": True,
                        "prompt": f"tell me {i} " * 40}) as r:
                    r.read()
            elif kind == 4:
                r = client.post(completions, json={"model": MODEL, "prompt": "x",
                                                   "max_tokens": -1})
            elif kind == 5:
                r = client.post(chat, json={"model": "no-such-model", "messages": [
                    {"role": "user", "content": "hi"}]})
            elif kind == 6:
                r = client.post(base + "/tokenize", json={"model": MODEL,
                                                          "prompt": f"count {i} " * 50})
            else:  # big enough for a worker thread
                r = client.post(chat, json={"model": MODEL, "max_tokens": 2,
                                            "messages": _conversation(121)})
            return r.status_code

    return one


def _run(load: Callable[[int], int], n: int, concurrency: int = 16) -> list[int]:
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(load, range(n)))


def _within(idle: dict[int, int], deadline: float) -> dict[int, float]:
    """Poll until both processes' RSS are within the tolerance of idle (or the deadline);
    returns the last ratios."""
    while True:
        ratios = {pid: _rss(pid) / base for pid, base in idle.items()}
        if all(r <= 1 + RSS_TOLERANCE for r in ratios.values()) \
                or time.monotonic() > deadline:
            return ratios
        time.sleep(0.1)


def test_memory_returns_after_a_30mb_request_and_1000_mixed_requests(
        hostile_server: HostileServer) -> None:
    base = hostile_server.base
    load = _mixed(base)
    # Idle means after a warm-up of the same load: the engine core keeps the memory its
    # biggest steps used (engine/process.py: keep_freed_memory), as a server does anyway.
    statuses = _run(load, 200)
    assert set(statuses) <= {200, 400, 404}, statuses
    wait_idle(base)
    pids = (hostile_server.pid, hostile_server.engine)
    idle = {pid: _rss(pid) for pid in pids}
    # /health while big bodies land is test_a_30mb_prompt_is_refused_by_its_size's subject,
    # and under 16 clients on two cores it is not this test's: this one checks memory, and
    # that the server came through (the same engine core, no traceback).
    log_offset = len(hostile_server.log.read_text(errors="replace"))
    for path, body in ((COMPLETIONS, {"model": MODEL, "prompt": BIG}),
                       (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": BIG}]}),
                       ("/tokenize", {"model": MODEL, "prompt": BIG})):
        _by_size(_post(hostile_server, path, body))
    after_big = _within(idle, time.monotonic() + 30)
    statuses = _run(load, 1000)
    assert statuses.count(200) == 6 * 125 and statuses.count(400) == 125, statuses
    wait_idle(base)
    after_many = _within(idle, time.monotonic() + 30)
    log = hostile_server.log.read_text(errors="replace")[log_offset:]
    assert "Traceback" not in log, log[-3000:]
    assert engine_pid(hostile_server.pid) == hostile_server.engine
    names = {hostile_server.pid: "server", hostile_server.engine: "engine"}
    report = {names[pid]: (f"idle {idle[pid] >> 20} MiB", f"after 30 MB x{after_big[pid]:.2f}",
                           f"after 1000 x{after_many[pid]:.2f}") for pid in pids}
    for ratios in (after_big, after_many):
        assert all(r <= 1 + RSS_TOLERANCE for r in ratios.values()), report
