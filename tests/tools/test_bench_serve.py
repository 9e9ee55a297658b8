"""tools/bench/bench_serve.py against a real ``izh-trio serve``: the CLI as a user runs it; and its
HTTP/SSE client against a tiny raw server that frames responses in every awkward way."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.e2e.conftest import free_port, running_server, serve_args

ROOT = Path(__file__).resolve().parents[2]
TOOL = [sys.executable, "-m", "tools.bench.bench_serve"]  # run from ROOT
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LATENCIES = ("ttft", "tpot", "itl", "e2el")
N, INPUT, OUTPUT = 12, 16, 8


def bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TOOL, "--no-progress", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_MAGIC


@pytest.fixture(scope="module")
def base_url(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("bench-logs") / "server.log"
    with running_server(serve_args(tiny_dir, port), log, port=port) as (base, _proc):
        yield base


@pytest.fixture(scope="module")
def sweep(base_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """One completions sweep shared by the tests that read its outputs."""
    out = tmp_path_factory.mktemp("bench")
    res = bench("--base-url", base_url, "--num-prompts", str(N), "--concurrency", "1,4",
                "--input-len", str(INPUT), "--output-len", str(OUTPUT), "--warmup", "1",
                "--label", "izh", "--result-json", str(out / "r.json"),
                "--plot", str(out / "r.png"))
    assert res.returncode == 0, res.stdout + res.stderr
    return out / "r.json", out / "r.png", res.stdout


def check_point(p: dict[str, Any], *, n: int, output_len: int | None) -> None:
    assert p["completed"] == n and p["failed"] == 0 and p["errors"] == []
    if output_len is not None:  # ignore_eos: every request runs to max_tokens
        assert p["total_output_tokens"] == n * output_len
    assert p["total_input_tokens"] > 0 and p["duration"] > 0
    d = p["duration"]
    assert p["request_throughput"] == pytest.approx(n / d)
    assert p["output_throughput"] == pytest.approx(p["total_output_tokens"] / d)
    assert p["total_token_throughput"] == pytest.approx(
        (p["total_input_tokens"] + p["total_output_tokens"]) / d)
    for m in LATENCIES:
        mean, med, p99 = p[f"mean_{m}_ms"], p[f"median_{m}_ms"], p[f"p99_{m}_ms"]
        assert mean > 0 and 0 < med <= p99, (m, mean, med, p99)
    # a request's wait for its first token is part of its end-to-end latency
    assert p["median_ttft_ms"] <= p["p99_e2el_ms"]
    assert p["mean_e2el_ms"] < d * 1000
    assert 1 <= p["max_concurrent_requests"] <= (p["max_concurrency"] or n)
    assert p["max_output_tokens_per_s"] > 0
    assert p["client_cpu_s"] > 0  # the load generator's own CPU over the point
    assert p["client_cpu_us_per_token"] == pytest.approx(
        p["client_cpu_s"] / p["total_output_tokens"] * 1e6)


def test_sweep_json_table_and_png(sweep: tuple[Path, Path, str], base_url: str) -> None:
    json_path, png_path, stdout = sweep
    doc = json.loads(json_path.read_text())
    assert doc["label"] == "izh" and doc["base_url"] == base_url
    assert doc["endpoint"] == "completions" and doc["model"]
    assert doc["started_at"] <= doc["finished_at"]
    assert doc["config"]["num_prompts"] == N and doc["config"]["concurrency"] == [1, 4]
    assert [p["max_concurrency"] for p in doc["points"]] == [1, 4]
    for p in doc["points"]:
        check_point(p, n=N, output_len=OUTPUT)
        if doc["server"]["prompt_source"] != "words":  # token-id prompts have exact lengths
            assert p["total_input_tokens"] == N * INPUT
    assert doc["points"][0]["max_concurrent_requests"] == 1
    assert is_png(png_path)
    for row in ("output throughput (tok/s)", "median TTFT (ms)", "p99 ITL (ms)", "c=4",
                "client CPU per token (us)"):
        assert row in stdout


def test_plot_mode_draws_two_results(sweep: tuple[Path, Path, str], tmp_path: Path) -> None:
    json_path, _, _ = sweep
    other = json.loads(json_path.read_text()) | {"label": "other"}
    (tmp_path / "b.json").write_text(json.dumps(other))
    res = subprocess.run([*TOOL, "plot", str(json_path),
                          str(tmp_path / "b.json"), "--out", str(tmp_path / "cmp.png")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert is_png(tmp_path / "cmp.png")


def test_dead_url_counts_failures(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    res = bench("--base-url", dead, "--model", "m", "--num-prompts", "3", "--concurrency",
                "2", "--input-len", "4", "--output-len", "2", "--timeout", "10",
                "--result-json", str(tmp_path / "dead.json"))
    assert res.returncode == 3, res.stdout + res.stderr  # documented: some requests failed
    assert "Traceback" not in res.stderr
    (p,) = json.loads((tmp_path / "dead.json").read_text())["points"]
    assert p["completed"] == 0 and p["failed"] == 3
    assert p["errors"] and all("ConnectError" in e for e in p["errors"])
    assert p["median_ttft_ms"] is None and p["output_throughput"] == 0
    assert "3 failed" in res.stdout


def test_chat_endpoint(base_url: str, tmp_path: Path) -> None:
    probe = httpx.post(base_url + "/v1/chat/completions", timeout=30, json={
        "model": httpx.get(base_url + "/v1/models").json()["data"][0]["id"],
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    if probe.status_code != 200:
        pytest.skip(f"/v1/chat/completions answered {probe.status_code}: not served yet")
    res = bench("--base-url", base_url, "--endpoint", "chat", "--num-prompts", "6",
                "--concurrency", "3", "--input-len", "24", "--output-len", "6",
                "--result-json", str(tmp_path / "chat.json"))
    assert res.returncode == 0, res.stdout + res.stderr
    (p,) = json.loads((tmp_path / "chat.json").read_text())["points"]
    check_point(p, n=6, output_len=6)
    assert p["total_input_tokens"] >= 6 * 10  # the server's count, chat template included


def tool(name: str) -> Any:
    """A module of tools/bench."""
    return importlib.import_module(f"tools.bench.{name}")


def test_https_is_refused_clearly() -> None:
    res = bench("--base-url", "https://127.0.0.1:1", "--model", "m", timeout=30)
    assert res.returncode == 2 and "https is not supported" in res.stderr


def test_summary_arithmetic() -> None:
    """TPOT, ITL and peaks from hand-made outcomes, without a server."""
    client, metrics = tool("client"), tool("metrics")
    # three events in the first read: one arrival, no inter-token latencies of 0
    ok = client.Outcome(ok=True, start=0.0, end=1.0, ttft=0.2,
                        chunk_times=[0.2, 0.2, 0.2, 0.6, 1.0], prompt_tokens=10, output_tokens=5)
    bad = client.Outcome(error="HTTP 500: boom")
    p = metrics.summarize([ok, bad], duration=2.0)
    assert (p["completed"], p["failed"], p["errors"]) == (1, 1, ["HTTP 500: boom"])
    assert p["mean_tpot_ms"] == pytest.approx(200.0)  # (1.0 - 0.2) / (5 - 1)
    assert p["median_itl_ms"] == pytest.approx(400.0)
    assert p["median_e2el_ms"] == pytest.approx(1000.0)
    assert p["output_throughput"] == pytest.approx(2.5)
    assert p["total_token_throughput"] == pytest.approx(7.5)
    assert p["max_output_tokens_per_s"] == pytest.approx(5.0)  # all 5 tokens within 1 s
    assert p["max_concurrent_requests"] == 1


# --- the HTTP/SSE client against a raw server ---------------------------------------------

def sse(texts: list[str], *, nl: str = "\n", chat: bool = False, error: bool = False) -> bytes:
    """An OpenAI-style stream: one event per text, then usage and [DONE]."""
    def choice(t: str) -> dict[str, Any]:
        return {"index": 0, "delta": {"content": t}} if chat else {"index": 0, "text": t}
    events: list[Any] = [{"choices": [choice(t)]} for t in texts]
    if chat:  # a role-only opener, and reasoning text: the first counts nothing, the second does
        events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                  {"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}, *events]
    if error:
        events.append({"error": {"message": "engine fell over", "code": 500}})
    events.append({"choices": [], "usage": {"prompt_tokens": 7,
                                            "completion_tokens": len(texts) + chat}})
    lines = [*(json.dumps(e) for e in events), "[DONE]"]
    return "".join(f"data: {line}{nl}{nl}" for line in lines).encode()


def chunked(body: bytes, sizes: list[int]) -> bytes:
    """Chunk frames of these sizes (then the rest), one with an extension, a trailer at the end."""
    out, pos = [], 0
    for i, n in enumerate([*sizes, len(body)]):
        piece, pos = body[pos:pos + n], pos + n
        if piece:
            out.append(b"%X%s\r\n%s\r\n" % (len(piece), b";ext=1" if i == 1 else b"", piece))
    return b"".join(out) + b"0\r\nX-Trailer: 1\r\n\r\n"


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
CHUNKED_HEAD = SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"


def with_length(body: bytes, head: bytes = SSE_HEAD) -> bytes:
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


#: The pause before ``send_split``'s slow piece: the client, in this same event loop, reads
#: what came before it long before it ends, on a busy machine too.
SLOW_PAUSE = 0.25
#: ``time.perf_counter()`` (the clock of the client's timestamps) as each slow piece was sent.
slow_sent: list[float] = []


async def send_split(stream: trio.SocketStream, wire: bytes, cuts: list[int],
                     slow: int | None = None) -> None:
    """Send ``wire`` in pieces cut at ``cuts``, pausing so they arrive as separate reads;
    the piece that ends at ``slow`` comes ``SLOW_PAUSE`` after the one before (``slow_sent``
    says when)."""
    last = 0
    for cut in [*sorted(set(cuts)), len(wire)]:
        await trio.sleep(SLOW_PAUSE if cut == slow else 0.002)
        if cut == slow:
            slow_sent.append(time.perf_counter())
        await stream.send_all(wire[last:cut])
        last = cut


async def route_chunked(stream: trio.SocketStream, n: int) -> bool:
    body = chunked(sse(["Hello", " wor", "ld", "!"], chat=True), [7, 60, 200])
    wire = CHUNKED_HEAD + body
    first_crlf = len(CHUNKED_HEAD) + wire[len(CHUNKED_HEAD):].index(b"\r\n")
    second_text = len(CHUNKED_HEAD) + body.index(b"wor") + 1
    cuts = [*range(0, len(wire), 41), first_crlf + 1, second_text]  # "\r" | "\n" in framing
    await send_split(stream, wire, cuts, slow=second_text)
    return True


async def route_length(stream: trio.SocketStream, n: int) -> bool:
    wire = with_length(sse(["a", "b", "c"], nl="\r\n"))  # CRLF events, one read or two
    await send_split(stream, wire, [len(wire) // 2])
    return True


async def route_http10(stream: trio.SocketStream, n: int) -> bool:
    await stream.send_all(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
    await send_split(stream, sse(["x", "y"]), [5, 30])
    return False  # the end of the body is the end of the connection


async def route_bad(stream: trio.SocketStream, n: int) -> bool:
    body = json.dumps({"error": {"message": "max_tokens is too large", "code": 400}}).encode()
    await stream.send_all(with_length(body, b"HTTP/1.1 400 Bad Request\r\n"))
    return True


async def route_instream(stream: trio.SocketStream, n: int) -> bool:
    await stream.send_all(CHUNKED_HEAD + chunked(sse(["ok"], error=True), [40]))
    return True


async def route_once(stream: trio.SocketStream, n: int) -> bool:
    await stream.send_all(with_length(sse(["once"])))
    return False  # closes an idle keep-alive connection, without saying so


async def route_drop_second(stream: trio.SocketStream, n: int) -> bool:
    if n > 1:
        return False  # read the request, then hang up without a reply
    await stream.send_all(with_length(sse(["fine"])))
    return True


async def route_stall(stream: trio.SocketStream, n: int) -> bool:
    await stream.send_all(CHUNKED_HEAD)
    await trio.sleep_forever()
    return False


ROUTES: dict[str, Callable[[trio.SocketStream, int], Awaitable[bool]]] = {
    "/chunked": route_chunked, "/length": route_length, "/http10": route_http10,
    "/bad": route_bad, "/instream": route_instream, "/once": route_once,
    "/drop-second": route_drop_second, "/stall": route_stall}


async def read_request(stream: trio.SocketStream, buf: bytearray) -> bytes | None:
    """One request's head (its body is read and dropped); None at EOF."""
    while b"\r\n\r\n" not in buf:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buf += data
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end])
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(buf) < end + length:
        buf += await stream.receive_some(65536)
    del buf[:end + length]
    return head


@pytest.fixture
async def raw_server(nursery: trio.Nursery) -> tuple[str, list[bytes]]:
    """(base URL, the request heads it saw): one route per path, keep-alive when it says so."""
    heads: list[bytes] = []

    async def handle(stream: trio.SocketStream) -> None:
        buf, n = bytearray(), 0
        try:
            while (head := await read_request(stream, buf)) is not None:
                heads.append(head)
                n += 1
                if not await ROUTES[head.split(b" ")[1].decode()](stream, n):
                    break
        except trio.BrokenResourceError:
            pass
        finally:
            await stream.aclose()

    listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", heads


async def fetch(base: str, *paths: str, timeout: float = 5.0, **kw: Any) -> tuple[list, Any]:
    """stream_one each path in turn on one client; (outcomes, the client)."""
    client_mod, http = tool("client"), tool("http")
    async with http.HTTPClient(base, **kw) as client:
        outs = [await client_mod.stream_one(client, p, {"prompt": [1, 2]}, timeout)
                for p in paths]
    return outs, client


def assert_ok(o: Any, chunks: int, tokens: int) -> None:
    assert o.ok, o.error
    assert len(o.chunk_times) == chunks and o.output_tokens == tokens
    assert o.prompt_tokens == 7 and 0 < o.ttft <= o.e2e
    assert o.chunk_times == sorted(o.chunk_times) and o.chunk_times[0] == o.start + o.ttft


@pytest.mark.timing
async def test_chunked_sse_split_anywhere(raw_server: tuple[str, list[bytes]]) -> None:
    base, heads = raw_server
    slow_sent.clear()
    outs, client = await fetch(base, "/chunked", "/chunked",
                               headers={"Authorization": "Bearer sekrit"})
    assert len(slow_sent) == len(outs)
    for o, sent in zip(outs, slow_sent, strict=True):
        assert_ok(o, chunks=5, tokens=5)  # reasoning + 4 texts; the role-only opener is no token
        # The second text's last byte was sent late: the event is timed when it arrived, after
        # that, and the text before it when it arrived, before.
        assert o.chunk_times[1] < sent <= o.chunk_times[2]
    assert client.opened == 1  # the keep-alive socket was reused
    head = heads[0].decode().lower()
    for line in ("post /chunked http/1.1", f"host: {base[7:]}", "content-type: application/json",
                 "authorization: bearer sekrit", "content-length: 16"):  # {"prompt":[1,2]}
        assert line in head


async def test_length_and_close_delimited_bodies(raw_server: tuple[str, list[bytes]]) -> None:
    base, _ = raw_server
    outs, client = await fetch(base, "/length", "/http10", "/length", "/http10")
    for o, n in zip(outs, (3, 2, 3, 2), strict=True):
        assert_ok(o, chunks=n, tokens=n)
    assert client.opened == 2  # /http10 went out on /length's socket and used it up


@pytest.mark.timing
async def test_failures_are_outcomes(raw_server: tuple[str, list[bytes]]) -> None:
    base, _ = raw_server
    (bad, instream, stall, after), _ = await fetch(
        base, "/bad", "/instream", "/stall", "/length", timeout=0.5)
    assert not bad.ok and bad.error.startswith("RuntimeError: HTTP 400: ")
    assert "max_tokens is too large" in bad.error
    assert not instream.ok and "in-stream error" in instream.error
    assert "engine fell over" in instream.error
    assert not stall.ok and stall.error == "timeout after 0.5 s"
    assert_ok(after, chunks=3, tokens=3)  # one bad request never ends a run


async def test_pool_replaces_sockets_the_server_closed(
        raw_server: tuple[str, list[bytes]]) -> None:
    base, heads = raw_server
    client_mod, http = tool("client"), tool("http")
    async with http.HTTPClient(base) as client:
        for opened in (1, 2, 3):  # the server hung up while the socket sat in the pool
            o = await client_mod.stream_one(client, "/once", {}, 5)
            assert_ok(o, chunks=1, tokens=1)
            assert client.opened == opened
            await trio.sleep(0.05)
        for opened in (4, 5):  # it reads the reused socket's request, then hangs up: retried
            o = await client_mod.stream_one(client, "/drop-second", {}, 5)
            assert_ok(o, chunks=1, tokens=1)
            assert client.opened == opened
    assert [h.split(b" ")[1] for h in heads].count(b"/drop-second") == 3


async def test_connect_error_is_an_outcome() -> None:
    (o,), _ = await fetch(f"http://127.0.0.1:{free_port()}", "/x")
    assert not o.ok and o.error.startswith("ConnectError: ")


def test_framing_fed_byte_by_byte() -> None:
    """Every split point at once: the head (after a 100 Continue), chunk frames, SSE events."""
    client_mod, framing = tool("client"), tool("framing")
    body = sse(["p", "q"], nl="\r\n")
    wire = (b"HTTP/1.1 100 Continue\r\n\r\n" + CHUNKED_HEAD + chunked(body, [3, 90]))
    resp, rest, got = None, b"", b""
    splitter, events = client_mod.SSESplitter(), []
    for i in range(len(wire)):
        rest += wire[i:i + 1]
        if resp is None:
            resp, rest = framing.parse_head(rest)
            continue
        piece, rest = resp.take(rest)
        got += piece
        events += splitter.feed(piece)
    assert resp is not None and resp.status == 200 and resp.complete and resp.keep_alive
    assert got == body and rest == b""
    assert [json.loads(e) if e.strip() != b"[DONE]" else "[DONE]" for e in events] == \
        [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
         for line in body.decode().split("\r\n\r\n") if line]
