"""What hypercorn-trio costs per request and per streamed event with no model behind it.

    python -m tools.studies.bench_http_floor [--apps asgi,quart] [--step-ms 20] [--json]

Two stand-in servers on hypercorn's trio worker answer ``POST /v1/completions`` with OpenAI
SSE chunks, one token per stream per tick of a shared step clock (as an engine step gives
every running request one token), the last token's chunk, a usage chunk and ``[DONE]`` in one
write (as our server sends them):

* ``asgi``: a bare ASGI callable, nothing but hypercorn and trio under it;
* ``quart``: the same through a QuartTrio route returning a streamed ``Response``.

The same client as ``tools.bench.bench_serve`` drives each through the workloads below; the
figure is the server process's CPU per output token. With one token per request that is the
per-request cost (accept the request, parse it, start and end a stream); with 64 it is mostly
the per-event cost. Our frontend pays these before any code of its own, so they are the floor
under its figures in ``tools.bench.compare_peers``.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import trio

from tools.bench import servers

WORKLOADS = {  # name: (concurrency, prompts, output tokens)
    "32x1": (32, 1024, 1),
    "32x32": (32, 256, 32),
    "256x64": (256, 768, 64),
}
_MODEL = {"object": "list", "data": [{"id": "floor", "object": "model"}]}


class _StepClock:
    """Every waiter wakes on the same tick, as every running request gets a token per step."""

    def __init__(self, period: float) -> None:
        self.period = period
        self._tick = trio.Event()

    async def run(self) -> None:
        while True:
            await trio.sleep(self.period)
            self._tick, tick = trio.Event(), self._tick
            tick.set()

    async def wait(self) -> None:
        await self._tick.wait()


def _chunk(text: str, finish: str | None) -> bytes:
    body = {"id": "cmpl-floor", "object": "text_completion", "created": 0, "model": "floor",
            "choices": [{"index": 0, "text": text, "logprobs": None,
                         "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _events(clock: _StepClock, max_tokens: int):
    for i in range(max_tokens):
        await clock.wait()
        if i < max_tokens - 1:
            yield _chunk(" tok", None)
            continue
        usage = {"id": "cmpl-floor", "object": "text_completion", "created": 0,
                 "model": "floor", "choices": [],
                 "usage": {"prompt_tokens": 32, "completion_tokens": max_tokens,
                           "total_tokens": 32 + max_tokens}}
        yield (_chunk(" tok", "length") + b"data: " + json.dumps(usage).encode()
               + b"\n\ndata: [DONE]\n\n")


def _asgi_app(clock: _StepClock) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        route = (scope["method"], scope["path"])
        if route not in (("GET", "/v1/models"), ("POST", "/v1/completions")):
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        sse = route[1] == "/v1/completions"
        kind = b"text/event-stream" if sse else b"application/json"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", kind)]})
        if not sse:
            await send({"type": "http.response.body", "body": json.dumps(_MODEL).encode()})
            return
        async for event in _events(clock, int(json.loads(body)["max_tokens"])):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def _quart_app(clock: _StepClock) -> Any:
    from quart import Response, request
    from quart_trio import QuartTrio

    app = QuartTrio("floor")
    app.config["RESPONSE_TIMEOUT"] = None

    @app.get("/v1/models")
    async def models() -> Any:
        return _MODEL

    @app.post("/v1/completions")
    async def completions() -> Any:
        body = await request.get_json()
        return Response(_events(clock, int(body["max_tokens"])), mimetype="text/event-stream")

    return app


def serve(kind: str, port: int, step_ms: float) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    clock = _StepClock(step_ms / 1000)
    app = _asgi_app(clock) if kind == "asgi" else _quart_app(clock)

    async def until_signalled() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                return

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(clock.run)
            await hypercorn_serve(app, config, shutdown_trigger=until_signalled)
            nursery.cancel_scope.cancel()

    trio.run(main)


def _measure(port: int, proc: subprocess.Popen, workload: str, out: Path) -> dict[str, float]:
    conc, prompts, tokens = WORKLOADS[workload]
    before = servers.tree_cpu_s(proc.pid)
    subprocess.run([*servers.tool("tools.bench.bench_serve"),
                    "--base-url", f"http://127.0.0.1:{port}", "--concurrency", str(conc),
                    "--num-prompts", str(prompts), "--input-len", "32", "--output-len",
                    str(tokens), "--warmup", str(conc), "--no-progress", "--result-json",
                    str(out)], check=True, stdout=subprocess.DEVNULL, cwd=servers.ROOT)
    point = json.loads(out.read_text())["points"][0]
    # The warm-up wave is in the CPU figure too: a small overestimate, the same for each app.
    total = point["total_output_tokens"] + conc * tokens
    return {"output_throughput": point["output_throughput"],
            "server_cpu_us_per_token": 1e6 * (servers.tree_cpu_s(proc.pid) - before) / total}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--apps", default="asgi,quart")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--step-ms", type=float, default=20.0, help="the step clock's period")
    p.add_argument("--rounds", type=int, default=3, help="medians over this many rounds")
    p.add_argument("--port", type=int, default=8310)
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--serve", choices=("asgi", "quart"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        return serve(a.serve, a.port, a.step_ms)
    apps, workloads = a.apps.split(","), a.workloads.split(",")
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.rounds):
            for app in apps:  # one server at a time: an idle one still takes CPU here
                cmd = [*servers.tool("tools.studies.bench_http_floor"), "--serve", app,
                       "--port", str(a.port), "--step-ms", str(a.step_ms)]
                proc = servers.start(cmd, Path(tmp) / f"{app}.log")
                try:
                    servers.wait_ready(a.port, proc, timeout=60)
                    for w in workloads:
                        runs.setdefault((app, w), []).append(
                            _measure(a.port, proc, w, Path(tmp) / "point.json"))
                finally:
                    servers.stop(proc)
    result = {f"{app}/{w}": {k: round(statistics.median(r[k] for r in rs), 1) for k in rs[0]}
              for (app, w), rs in runs.items()}
    if a.json:
        print(json.dumps(result))
        return
    print(f"{'app/workload':16}{'tokens/s':>10}{'server CPU/token (µs)':>24}")
    for name, r in result.items():
        print(f"{name:16}{r['output_throughput']:10.0f}{r['server_cpu_us_per_token']:24.1f}")


if __name__ == "__main__":
    main()
