"""The two ways to start the server both answer, on real checkpoints, through real HTTP."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import torch
import transformers

from tests.e2e.conftest import free_port, running_server, serve_args, wait_for_metrics


def test_greedy_tokens_equal_transformers(server: str, hf_dir: Path) -> None:
    """Acceptance: temperature 0 + ignore_eos gives exactly transformers' greedy tokens."""
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    for prompt in ([5, 17, 230, 1400, 9], list(range(200, 260)), [1992, 882, 198]):
        out = client.completions.create(model="qwen3-test", prompt=prompt, max_tokens=40,
                                        temperature=0, extra_body={"ignore_eos": True})
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=40, min_new_tokens=40,
                             do_sample=False)[0, len(prompt):].tolist()
        tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
        assert out.choices[0].text == tok.decode(ref, skip_special_tokens=True)
        assert out.usage.completion_tokens == 40
        assert out.usage.prompt_tokens == len(prompt)
        assert out.choices[0].finish_reason == "length"


def test_stream_reassembles_to_the_same_text(server: str) -> None:
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    kwargs = dict(model="qwen3-test", prompt="Once upon a time", max_tokens=30, temperature=0,
                  extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30
    assert {c.id for c in chunks} == {chunks[0].id}


def test_seeded_sampling_is_reproducible(server: str) -> None:
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    kwargs = dict(model="qwen3-test", prompt="A", max_tokens=20, temperature=1.0, top_p=0.9,
                  seed=1234, extra_body={"ignore_eos": True, "min_p": 0.01, "top_k": 50})
    assert len({client.completions.create(**kwargs).choices[0].text for _ in range(3)}) == 1


def test_models_health_and_metrics(server: str) -> None:
    models = httpx.get(server + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["qwen3-test"]
    assert httpx.get(server + "/health").status_code == 200
    metrics = httpx.get(server + "/metrics").text
    for name in ("izh:num_requests_running", "izh:num_requests_waiting",
                 "izh:kv_cache_usage_perc", "izh:time_to_first_token_seconds_bucket"):
        assert name in metrics
    # The event loop is sampled from start-up on: its lag is there once the server serves.
    samples = wait_for_metrics(server, lambda m: m["izh:event_loop_lag_seconds_count"] > 0,
                               what="an event-loop lag sample")
    assert samples["izh:event_loop_lag_max_seconds"] >= 0
    # The engine's time in steps grows with a request; its last step's threads are given.
    before = samples["izh:engine_step_seconds_total"]
    httpx.post(server + "/v1/completions", json={"prompt": "A", "max_tokens": 3},
               timeout=60).raise_for_status()
    samples = wait_for_metrics(server, lambda m: m["izh:engine_step_seconds_total"] > before,
                               what="engine step time")
    assert samples["izh:engine_step_threads"] >= 1


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b'{"prompt": "x", "max_tokens": "5"}', 400, "max_tokens"),
        (b'{"prompt": "x", "temperature": -1}', 400, "temperature"),
        (b'{"max_tokens": 5}', 400, "prompt"),
        (b'{"prompt": ""}', 400, "prompt"),
        (b'{"prompt": [1, 2, 999999]}', 400, "prompt"),
        (b'{"prompt": "x", "max_tokens": 100000}', 400, "max_tokens"),
        (b'{"prompt": "x", "model": "nope"}', 404, "model"),
    ],
)
def test_bad_requests_get_openai_errors(server: str, body: bytes, status: int, param) -> None:
    r = httpx.post(server + "/v1/completions", content=body,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param
    assert "Traceback" not in r.text
    assert httpx.get(server + "/health").status_code == 200


def test_unknown_route_and_method(server: str) -> None:
    assert httpx.get(server + "/v1/nothing").json()["error"]["code"] == 404
    r = httpx.get(server + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_hypercorn_cli_serves_the_default_tiny_model(tmp_path: Path) -> None:
    """``hypercorn -k trio izh_trio.app:app`` with IZH_* settings; no model: the tiny one."""
    port = free_port()
    args = [sys.executable, "-m", "hypercorn", "-k", "trio", "--bind", f"127.0.0.1:{port}",
            "izh_trio.app:app"]
    env = {"IZH_CACHE_DIR": str(tmp_path / "cache"), "IZH_SERVED_MODEL_NAME": "tiny"}
    with running_server(args, tmp_path / "log", env=env, port=port) as (base, _):
        r = httpx.post(base + "/v1/completions", json={"prompt": "Hello", "max_tokens": 8,
                                                       "model": "tiny"}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
    assert (tmp_path / "cache" / "tiny-qwen3-v2" / "model.safetensors").is_file()


def test_a_busy_port_fails_at_once_in_one_line() -> None:
    """Before any model loads: the whole of stderr is the one line, exit status 1."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(serve_args(None, port), capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    assert done.stderr == f"izh-trio: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_a_start_up_failure_is_one_line_not_a_traceback(hf_dir: Path, tmp_path: Path) -> None:
    """A checkpoint without a tokenizer or a missing keys file fails in the frontend; a
    max_model_len beyond the checkpoint's positions fails in the engine core. Either way the
    operator gets the reason as the last line, exit status 1, and no traceback."""
    empty = tmp_path / "empty"
    empty.mkdir()
    keys = tmp_path / "no-such-keys-file"
    cases = [
        (serve_args(empty, free_port()), f"izh-trio: cannot start: {empty} has no tokenizer.json"),
        (serve_args(hf_dir, free_port(), "--api-keys-file", str(keys)),
         f"izh-trio: cannot start: [Errno 2] No such file or directory: '{keys}'"),
        (serve_args(hf_dir, free_port(), "--max-model-len", "100000"),
         "izh-trio: cannot start: engine failed to start: max_model_len 100000 is longer than "
         "the checkpoint's max_position_embeddings (2048)"),
    ]
    for args, last_line in cases:
        done = subprocess.run(args, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines()[-1] == last_line
        assert "Traceback" not in done.stderr


def test_a_setting_out_of_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from izh_trio.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--kv-cache-gib", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "izh-trio serve: error: 'kv_cache_gib' must be > 0: 0.0")


def test_process_boundary_imports() -> None:
    """The frontend never loads torch; the engine never loads trio."""
    check = ("import sys, {mod}; bad = [m for m in {banned} if m in sys.modules]; "
             "assert not bad, bad")
    for mod, banned in [("izh_trio.app", ["torch", "triton"]),
                        ("izh_trio.cli", ["torch", "triton"]),
                        ("izh_trio.engine.core", ["trio", "quart", "hypercorn"]),
                        ("izh_trio.engine.process", ["trio", "quart", "hypercorn"])]:
        subprocess.run([sys.executable, "-c", check.format(mod=mod, banned=banned)],
                       check=True)


@pytest.mark.timing
def test_early_error_does_not_stall_the_connection(server: str) -> None:
    """A 404 sent before the body arrives must not wedge the next request on the socket."""
    import socket

    host, port = server.removeprefix("http://").split(":")
    body = b'{"prompt": "x", "max_tokens": 1}'
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/nowhere HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        reply = b""
        while b"\r\n\r\n" not in reply:  # the error goes out before the body is sent
            reply += s.recv(65536)
        assert reply.startswith(b"HTTP/1.1 404")
        assert b"connection: close" in reply.lower()
        with contextlib.suppress(OSError):  # the server may have closed it already
            s.sendall(body)
    with httpx.Client(timeout=5) as client:  # keep-alive clients carry on
        assert client.post(server + "/v1/nowhere", json={}).status_code == 404
        assert client.post(server + "/v1/completions",
                           json={"prompt": "x", "max_tokens": 1}).status_code == 200



async def _read_to_eof(port: int, request: bytes) -> bytes:
    import trio

    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        data = b""
        while chunk := await stream.receive_some():
            data += chunk
        return data


async def test_a_burst_of_connection_close_requests_all_end(server: str) -> None:
    """400 clients at once, each reading to EOF: every connection is answered and closed."""
    import trio

    port = int(server.rsplit(":", 1)[1])
    heads: list[bytes] = []

    async def one() -> None:
        data = await _read_to_eof(
            port, b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        heads.append(data.split(b" ", 2)[1])

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(400):
                nursery.start_soon(one)
    assert heads == [b"200"] * 400


async def test_http_1_0_stream_ends_with_the_connection(server: str) -> None:
    """An HTTP/1.0 SSE stream has no chunked framing: it must end by closing the socket."""
    import trio

    port = int(server.rsplit(":", 1)[1])
    body = b'{"model": "qwen3-test", "prompt": "hi", "max_tokens": 4, "stream": true}'
    request = (b"POST /v1/completions HTTP/1.0\r\ncontent-type: application/json\r\n"
               b"content-length: %d\r\n\r\n%s" % (len(body), body))
    with trio.fail_after(30):
        data = await _read_to_eof(port, request)
    assert data.startswith(b"HTTP/1.0 200") or data.startswith(b"HTTP/1.1 200")
    assert data.rstrip().endswith(b"data: [DONE]")


def _http_chunks(response: bytes) -> list[bytes]:
    """The chunks of a chunked HTTP/1.1 body, in order (one per write the server made)."""
    body = response.split(b"\r\n\r\n", 1)[1]
    chunks = []
    while True:
        size_line, body = body.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return chunks
        chunks.append(body[:size])
        body = body[size + 2:]


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
async def test_a_stream_ends_in_one_write(server: str, route: str) -> None:
    """The last tokens, the usage chunk and ``[DONE]`` leave in one write, not three: every
    write to a client is a syscall and a wake-up of its reader, per request."""
    import json

    import trio

    port = int(server.rsplit(":", 1)[1])
    ask = ({"prompt": [5, 17, 230]} if route == "completions"
           else {"messages": [{"role": "user", "content": "hi"}]})
    body = json.dumps({"model": "qwen3-test", "max_tokens": 4, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True},
                       **ask}).encode()
    request = (b"POST /v1/%s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
               b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
               % (route.encode(), len(body), body))
    with trio.fail_after(30):
        chunks = _http_chunks(await _read_to_eof(port, request))
    events = [e for c in chunks for e in c.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    usage = json.loads(events[-2].removeprefix(b"data: "))
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    last = chunks[-1]
    assert b'"finish_reason":"length"' in last and b'"usage":{' in last
    assert last.endswith(b"data: [DONE]\n\n")
    assert len(chunks) <= 4  # at most one write per engine step, the last one shared
