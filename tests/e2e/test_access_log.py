"""The access log, read from real servers' logs: one line per request, in text or JSON.

Every wait is for a state (a line in the log, polled up to a deadline), never a fixed sleep,
and the servers whose long stream must still be running when the client leaves, or when the
engine is killed, run a paced engine (``PACED``: 1,800 tokens take 18 s or more anywhere).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import PACED, engine_pid, free_port, running_server, serve_args

#: In every prompt and bad body sent here; it must never reach the log.
MARKER = f"zqx-marker-{uuid.uuid4().hex}"
LONG = {"prompt": f"{MARKER} Go on.", "max_tokens": 1800, "temperature": 0,
        "ignore_eos": True, "stream": True}

_INTS = ("status", "prompt_tokens", "completion_tokens", "cached_tokens", "error_status")
_TEXT_ACCESS = re.compile(r"^\S+ \S+ izh_trio\.access ([A-Z]+) (.*)$")
_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s"]+)(?: |$)')

Line = tuple[str, dict[str, Any]]  # level, fields


def _parse_text(line: str) -> Line | None:
    """An access line in text: ``key=value`` pairs after the level, as the JSON line's fields."""
    match = _TEXT_ACCESS.match(line)
    if match is None:
        return None
    level, rest = match.groups()
    pairs = _PAIR.findall(rest)
    assert " ".join(f"{k}={v}" for k, v in pairs) == rest, f"not key=value pairs: {rest!r}"
    raw = {k: json.loads(v) if v.startswith('"') else v for k, v in pairs}
    fields: dict[str, Any] = {k: None for k in (*_INTS, "method", "path", "request_id",
                                                 "ttft", "error")}
    fields.update(raw)
    for key in _INTS:
        fields[key] = None if fields[key] is None else int(fields[key])
    for key in ("ttft", "duration"):
        fields[key] = None if fields.get(key) is None else float(fields[key])
    fields["finish_reasons"] = raw["finish_reasons"].split(",") if "finish_reasons" in raw \
        else []
    fields["disconnected"] = raw.get("disconnected") == "true"
    return level, fields


def _parse_json(line: str) -> Line | None:
    obj = json.loads(line)
    if obj["logger"] != "izh_trio.access":
        return None
    assert obj["message"] == f"{obj['method']} {obj['path']} {obj['status'] or '-'}"
    return obj["level"], obj


PARSERS: dict[str, Callable[[str], Line | None]] = {"text": _parse_text, "json": _parse_json}


def access_lines(log: Path, fmt: str) -> list[Line]:
    # The server may be mid-write: what follows the last newline is not a line yet.
    lines = log.read_text().split("\n")[:-1]
    return [parsed for line in lines if (parsed := PARSERS[fmt](line)) is not None]


def wait_for_line(log: Path, fmt: str, request_id: str, timeout: float = 30.0) -> Line:
    """The access line of the request with this id, once it has been written."""
    deadline = time.monotonic() + timeout
    while True:
        found = [x for x in access_lines(log, fmt) if x[1]["request_id"] == request_id]
        if found:
            assert len(found) == 1, found
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no access line for {request_id!r} within {timeout}s:\n"
                                 + log.read_text()[-3000:])
        time.sleep(0.02)


def _usage_matches(fields: dict[str, Any], usage: dict[str, Any]) -> None:
    assert fields["prompt_tokens"] == usage["prompt_tokens"]
    assert fields["completion_tokens"] == usage["completion_tokens"]
    assert fields["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]


def _check_requests(base: str, log: Path, fmt: str) -> None:
    chat = base + "/v1/chat/completions"
    messages = [{"role": "user", "content": f"{MARKER} say something"}]
    with httpx.Client(timeout=60) as client:
        # A plain chat request, with a client's id that needs quoting in text.
        rid = 'client id "7"'
        r = client.post(chat, json={"messages": messages, "max_tokens": 6},
                        headers={"X-Request-Id": rid})
        assert r.status_code == 200 and r.headers["X-Request-Id"] == rid
        level, f = wait_for_line(log, fmt, rid)
        assert level == "INFO"
        assert (f["method"], f["path"], f["status"]) == ("POST", "/v1/chat/completions", 200)
        _usage_matches(f, r.json()["usage"])
        assert f["finish_reasons"] == [r.json()["choices"][0]["finish_reason"]]
        assert 0 < f["ttft"] <= f["duration"]
        assert not f["disconnected"] and f["error"] is None

        # A streamed one: the id is the server's; the totals are the usage chunk's.
        body = {"messages": messages, "max_tokens": 5, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        with client.stream("POST", chat, json=body) as s:
            rid = s.headers["X-Request-Id"]
            events = [e for e in s.iter_lines() if e.startswith("data: {")]
        usage = json.loads(events[-1].removeprefix("data: "))["usage"]
        level, f = wait_for_line(log, fmt, rid)
        assert level == "INFO" and f["status"] == 200
        _usage_matches(f, usage)
        assert usage["completion_tokens"] == 5 and f["finish_reasons"] == ["length"]
        assert 0 < f["ttft"] <= f["duration"] and not f["disconnected"]

        # A stream the client leaves after its first event: logged once it is over.
        with client.stream("POST", base + "/v1/completions", json=LONG) as s:
            rid = s.headers["X-Request-Id"]
            lines = s.iter_lines()
            for line in lines:
                if line.startswith("data: {"):
                    break
        level, f = wait_for_line(log, fmt, rid)
        assert level == "INFO" and f["status"] == 200 and f["disconnected"]
        assert 1 <= f["completion_tokens"] < LONG["max_tokens"]
        assert f["finish_reasons"] == [] and f["error"] is None

        # 4xx: the status, not the cause (a client error's message may quote what it sent).
        r = client.post(base + "/v1/completions", json={"prompt": MARKER, "max_tokens": "9"},
                        headers={"X-Request-Id": "bad-1"})
        assert r.status_code == 400
        level, f = wait_for_line(log, fmt, "bad-1")
        assert (level, f["status"], f["error"], f["prompt_tokens"]) == ("INFO", 400, None, None)
        r = client.post(base + "/v1/completions", json={"prompt": "x", "model": MARKER},
                        headers={"X-Request-Id": "bad-2"})
        assert r.status_code == 404 and MARKER in r.text
        level, f = wait_for_line(log, fmt, "bad-2")
        assert (level, f["status"], f["error"]) == ("INFO", 404, None)

        r = client.get(base + "/v1/nowhere", headers={"X-Request-Id": "missing-1"})
        assert r.status_code == 404
        level, f = wait_for_line(log, fmt, "missing-1")
        assert (level, f["method"], f["path"], f["status"]) == ("INFO", "GET", "/v1/nowhere",
                                                                404)
        r = client.get(base + "/health", headers={"X-Request-Id": "probe-1"})
        level, f = wait_for_line(log, fmt, "probe-1")
        assert (f["path"], f["status"], f["ttft"]) == ("/health", 200, None)


@pytest.mark.timing
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_one_line_per_request(hf_dir: Path, tmp_path: Path, fmt: str) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    args = serve_args(hf_dir, port, *(["--log-format", fmt] if fmt == "json" else []))
    with running_server(args, log, port=port, env=PACED) as (base, _):
        _check_requests(base, log, fmt)
    text = log.read_text()  # the server has stopped: its drain is logged too
    assert MARKER not in text
    if fmt == "json":
        # every line of both processes, the engine core's included, is one JSON object
        objects = [json.loads(line) for line in text.splitlines()]
        messages = [o["message"] for o in objects]
        assert any(m.startswith("serving ") for m in messages)
        assert any(o["logger"].startswith("izh_trio.engine.") for o in objects)
        assert any(m.startswith("draining: ") for m in messages)
        assert all({"time", "level", "logger", "message"} <= set(o) for o in objects)
    else:
        assert re.search(r" izh_trio\.frontend\.server INFO draining: ", text)


@pytest.mark.timing
def test_engine_failures_are_logged_with_their_cause(hf_dir: Path, tmp_path: Path) -> None:
    """A stream the engine fails after it began (an in-band error under a 200), then a 503
    while the engine is down, and /health's 503: each logged with its cause."""
    port = free_port()
    log = tmp_path / "server.log"
    args = serve_args(hf_dir, port, "--max-engine-restarts", "0")  # stays down: no race
    with running_server(args, log, port=port, env=PACED) as (base, proc), \
            httpx.Client(timeout=60) as c:
        child = engine_pid(proc.pid)
        with c.stream("POST", base + "/v1/completions", json=LONG,
                      headers={"X-Request-Id": "doomed"}) as s:
            events = []
            for line in s.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    if len(events) == 1:
                        os.kill(child, signal.SIGKILL)
        assert s.status_code == 200 and events[-1] == "data: [DONE]"
        in_band = json.loads(events[-2].removeprefix("data: "))["error"]["message"]
        level, f = wait_for_line(log, "text", "doomed")
        assert (level, f["status"], f["error_status"]) == ("ERROR", 200, 500)
        assert f["error"] == in_band and f["error"].startswith("the request failed in the engine")
        assert f["completion_tokens"] >= 1 and f["prompt_tokens"] >= 1

        r = c.post(base + "/v1/completions", json={"prompt": MARKER},
                   headers={"X-Request-Id": "refused"})
        assert r.status_code == 503
        level, f = wait_for_line(log, "text", "refused")
        assert (level, f["status"], f["error_status"]) == ("WARNING", 503, None)
        assert f["error"] == r.json()["error"]["message"]
        assert f["error"].startswith("the engine is unavailable")

        r = c.get(base + "/health", headers={"X-Request-Id": "probe"})
        assert r.status_code == 503
        level, f = wait_for_line(log, "text", "probe")
        assert level == "WARNING" and f["error"] == r.json()["error"]["message"]
    assert MARKER not in log.read_text()


def test_hypercorn_cli_logs_json_only(hf_dir: Path, tmp_path: Path) -> None:
    """``hypercorn izh_trio.app:app`` with IZH_LOG_FORMAT=json: hypercorn's own lines too are
    JSON objects of the one handler, each once."""
    port = free_port()
    log = tmp_path / "server.log"
    args = [sys.executable, "-m", "hypercorn", "-k", "trio", "--bind", f"127.0.0.1:{port}",
            "izh_trio.app:app"]
    env = {"IZH_MODEL_DIR": str(hf_dir), "IZH_LOG_FORMAT": "json"}
    with running_server(args, log, env=env, port=port) as (base, _):
        r = httpx.post(base + "/v1/completions", json={"prompt": MARKER, "max_tokens": 3},
                       headers={"X-Request-Id": "via-hypercorn"}, timeout=60)
        assert r.status_code == 200
        level, f = wait_for_line(log, "json", "via-hypercorn")
        assert level == "INFO" and f["status"] == 200
        _usage_matches(f, r.json()["usage"])
    lines = log.read_text().splitlines()
    objects = [json.loads(line) for line in lines]
    running = [o for o in objects if o["message"].startswith("Running on ")]
    assert len(running) == 1 and running[0]["logger"] == "hypercorn.error"
    assert MARKER not in "\n".join(lines)
