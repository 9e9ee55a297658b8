"""Frontend-to-core transport cost per engine step (issue #6): our pipe + msgpack vs ZeroMQ.

    python -m tools.studies.bench_transport [--transport pipe|zmq|both]
        [--mode saturated|paced|both] [--streams 256] [--steps 2000] [--paced-steps 300]
        [--interval-ms 35] [--repeat 1] [--json OUT]

A child plays the engine core: per step it builds one RequestOutput (one new token) per running
stream and sends a StepOutputs + Stats frame with the project's codec (the pipe child reuses the
core's reader thread). The trio parent plays EngineClient: it decodes as the real reader does,
fans out to real RequestStreams, and per step sends back an AddRequest and an Abort, so N streams
keep running and both directions carry traffic. It checks that every step arrives once, in
order, with N one-token outputs; any mismatch makes the exit status 3.

``saturated``: the child steps as fast as the transport takes it (throughput and CPU per step;
latency there is mostly queueing). ``paced``: one step per --interval-ms (35 ms is a real step
at 256 streams), so latency is the transport's own: from the outputs being ready in the child
(before encoding) to decoded and fanned out in the parent, on CLOCK_MONOTONIC (system-wide on
Linux). CPU is per process, all threads (zmq's I/O thread too). The first 10% of the steps
(20 at most) are verified but kept out of the figures. ZeroMQ's queues are bounded to about
what a pipe holds: with its defaults (1000 messages) a saturated child runs hundreds of steps
ahead, which measures queueing, not transport. --repeat runs the transports in turn and adds
medians, since a shared machine is noisy.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import math
import os
import platform
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import trio

from izh_trio import wire as w
from izh_trio.engine.process import _read_frames
from izh_trio.frontend.request_stream import Notifier, RequestStream
from izh_trio.wire.codec import HEADER_SIZE, decode_payload

VOCAB = 151_643  # Qwen3's regular vocabulary
ROOT = Path(__file__).resolve().parents[2]  # the child runs as a module of the checkout
CHILD = [sys.executable, "-m", "tools.studies.bench_transport", "--child"]
PARAMS = w.SamplingParams(max_tokens=4096, temperature=0.7, top_p=0.8, top_k=20)


def _zmq():
    """pyzmq, or None: it is only a bench dependency."""
    with contextlib.suppress(ImportError):
        import zmq

        return zmq
    return None


def _socket(ctx, kind: str):
    """Queues about what a pipe holds (64 KiB), so saturated runs compare like with like."""
    zmq = _zmq()
    sock = ctx.socket(getattr(zmq, kind))
    for opt in (zmq.SNDHWM, zmq.RCVHWM):  # messages: a frame each
        sock.setsockopt(opt, 2)
    for opt in (zmq.SNDBUF, zmq.RCVBUF):  # the ipc socket's kernel buffers
        sock.setsockopt(opt, 1 << 16)
    return sock


# ---------------------------------------------------------------- child: the engine core
def _zmq_reader(ctx, addr: str, inbox: queue.SimpleQueue) -> None:
    sock = _socket(ctx, "PULL")
    sock.connect(addr)
    while True:
        msgs = decode_payload(memoryview(sock.recv())[HEADER_SIZE:])
        for msg in msgs:
            inbox.put(msg)
        if any(isinstance(msg, w.Shutdown) for msg in msgs):
            return sock.close(linger=0)


def child(cfg: dict) -> int:
    """The core's side; ``cfg`` comes from the parent as JSON on the command line."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    n, steps, interval_ms = cfg["streams"], cfg["steps"], cfg["interval_ms"]
    if cfg["transport"] == "pipe":
        threading.Thread(target=_read_frames, args=(cfg["in_fd"], inbox), daemon=True).start()

        def write(frame: bytes) -> None:  # the core's _Writer, after its encode_frame
            view = memoryview(frame)
            while view:
                view = view[os.write(cfg["out_fd"], view):]
    else:
        ctx = _zmq().Context()
        out = _socket(ctx, "PUSH")
        out.connect(f"{cfg['addr']}-up")
        threading.Thread(target=_zmq_reader, args=(ctx, f"{cfg['addr']}-down", inbox),
                         daemon=True).start()
        write = out.send
    running: dict[str, list[int]] = {}  # request id -> [prompt tokens, output tokens]

    def drain(block: bool) -> bool:
        msgs = [inbox.get()] if block else []
        with contextlib.suppress(queue.Empty):
            while True:
                msgs.append(inbox.get_nowait())
        for msg in msgs:
            if msg is None or isinstance(msg, w.Shutdown | Exception):  # None: the pipe closed
                return False
            if isinstance(msg, w.AddRequest):
                running[msg.request_id] = [len(msg.prompt_token_ids), 0]
            elif isinstance(msg, w.Abort):
                for rid in msg.request_ids:
                    running.pop(rid, None)
        return True

    while len(running) < n:
        if not drain(True):
            return 2
    rng, start = random.Random(1), time.monotonic_ns()
    ready, encoded, sent, cpu = [], [], [], []
    for step in range(steps):
        if interval_ms:  # a fixed schedule, so a late step does not push the rest back
            due = start + step * interval_ms * 1e6
            time.sleep(max(0.0, (due - time.monotonic_ns()) / 1e9))
        if not drain(False):
            return 2
        outputs = []
        # At most N run, like max_num_seqs: an AddRequest may arrive a moment before its Abort.
        for rid, st in itertools.islice(running.items(), n):
            st[1] += 1
            outputs.append(w.RequestOutput(rid, (rng.randrange(VOCAB),), st[0], st[1], st[0] // 2))
        stats = w.Stats(len(outputs), len(running) - len(outputs), 0.42, 0, step,
                        generation_tokens_total=step * n)
        ready.append(time.monotonic_ns())
        frame = w.encode_frame([w.StepOutputs(outputs), stats])
        encoded.append(time.monotonic_ns())
        write(frame)
        sent.append(time.monotonic_ns())
        cpu.append(time.process_time())
    while drain(True):  # until the parent's Shutdown
        pass
    Path(cfg["report"]).write_text(json.dumps(
        {"cpu_s": cpu, "ready_ns": ready, "encoded_ns": encoded, "sent_ns": sent}))
    if cfg["transport"] == "zmq":
        out.close(linger=0)
        ctx.term()
    return 0


# ---------------------------------------------------------------- parent: the trio frontend
class _PipeConn:
    """EngineClient's way: FdStreams and an incremental FrameDecoder."""

    def __init__(self, to_core: int, from_core: int) -> None:
        self.out, self.inp = trio.lowlevel.FdStream(to_core), trio.lowlevel.FdStream(from_core)
        self.decoder, self.bytes_in = w.FrameDecoder(), 0

    async def send(self, frame: bytes) -> None:
        await self.out.send_all(frame)

    async def receive(self) -> list | None:
        data = await self.inp.receive_some(1 << 16)
        self.bytes_in += len(data)
        return self.decoder.feed(data) if data else None

    async def aclose(self) -> None:
        await self.out.aclose()
        await self.inp.aclose()


class _ZmqConn:
    """PUSH/PULL over ipc://; trio waits on the sockets' FDs."""

    def __init__(self, addr: str) -> None:
        self.zmq = zmq = _zmq()
        self.ctx, self.bytes_in = zmq.Context(), 0
        self.out, self.inp = _socket(self.ctx, "PUSH"), _socket(self.ctx, "PULL")
        self.out.bind(f"{addr}-down")
        self.inp.bind(f"{addr}-up")

    async def _wait(self, sock, flag: int) -> None:
        # The FD is edge-triggered and only means "look at EVENTS": check before every wait.
        while not sock.getsockopt(self.zmq.EVENTS) & flag:
            await trio.lowlevel.wait_readable(sock.getsockopt(self.zmq.FD))

    async def send(self, frame: bytes) -> None:
        while True:
            try:
                return self.out.send(frame, self.zmq.NOBLOCK)
            except self.zmq.Again:
                await self._wait(self.out, self.zmq.POLLOUT)

    async def receive(self) -> list | None:
        while True:  # wait only after EAGAIN: the FD does not fire again for queued messages
            try:
                data = self.inp.recv(self.zmq.NOBLOCK)
            except self.zmq.Again:
                await self._wait(self.inp, self.zmq.POLLIN)
                continue
            self.bytes_in += len(data)
            return decode_payload(memoryview(data)[HEADER_SIZE:])

    async def aclose(self) -> None:
        self.out.close(linger=0)
        self.inp.close(linger=0)
        self.ctx.term()


async def measure(transport: str, mode: str, args: argparse.Namespace, tmp: Path) -> dict:
    n = args.streams
    steps, interval = (args.steps, 0.0) if mode == "saturated" else (args.paced_steps,
                                                                      args.interval_ms)
    report = tmp / f"{transport}-{mode}-{uuid.uuid4().hex[:12]}.json"
    cfg = {"transport": transport, "streams": n, "steps": steps, "interval_ms": interval,
           "report": str(report), "addr": f"ipc://{tmp}/{uuid.uuid4().hex[:12]}"}
    fds: tuple[int, ...] = ()
    if transport == "pipe":  # as EngineClient.run
        (child_in, parent_out), (parent_in, child_out) = os.pipe(), os.pipe()
        cfg |= {"in_fd": child_in, "out_fd": child_out}
        fds, conn = (child_in, child_out), _PipeConn(parent_out, parent_in)
    else:
        conn = _ZmqConn(cfg["addr"])
    try:
        proc = await trio.lowlevel.open_process([*CHILD, json.dumps(cfg)], pass_fds=fds,
                                                 cwd=ROOT)
    finally:
        for fd in fds:
            os.close(fd)
    to_core_send, to_core_recv = trio.open_memory_channel(math.inf)

    async def write_loop() -> None:  # as EngineClient: one frame for all that is queued
        async with to_core_recv:
            async for first in to_core_recv:
                batch = [first]
                with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel):
                    while True:
                        batch.append(to_core_recv.receive_nowait())
                await conn.send(w.encode_frame(batch))

    rng, notifier = random.Random(0), Notifier()
    # Made before the clock starts: the frontend gets prompts from its tokenizer, not for free.
    prompts = itertools.cycle([[rng.randrange(VOCAB) for _ in range(rng.randint(64, 1024))]
                               for _ in range(64)])
    streams: dict[str, RequestStream] = {}
    order: collections.deque[str] = collections.deque()

    def add() -> None:
        prompt, rid = next(prompts), f"cmpl-{uuid.uuid4().hex}-0"
        streams[rid] = RequestStream(rid, len(prompt), 1 << 16, notifier,
                                     abort=lambda: to_core_send.send_nowait(w.Abort((rid,))))
        order.append(rid)
        to_core_send.send_nowait(w.AddRequest(rid, prompt, PARAMS))

    bad: collections.Counter[str] = collections.Counter()
    recv_ns, cpu, outputs = [], [], None
    with trio.fail_after(60 + steps * (interval / 1000 + 0.05)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_loop)
            for _ in range(n):
                add()
            while len(recv_ns) < steps and (msgs := await conn.receive()) is not None:
                for msg in msgs:
                    if isinstance(msg, w.StepOutputs):
                        outputs = msg.outputs
                        for out in outputs:  # EngineClient's fan-out
                            if (stream := streams.get(out.request_id)) is not None:
                                stream.push(out)
                        continue
                    if not isinstance(msg, w.Stats) or outputs is None:
                        bad["unexpected_message"] += 1
                        continue
                    recv_ns.append(time.monotonic_ns())
                    cpu.append(time.process_time())
                    bad["out_of_order"] += msg.num_steps != len(recv_ns) - 1
                    bad["wrong_output_count"] += len(outputs) != n
                    bad["wrong_token_count"] += sum(len(o.new_token_ids) != 1 for o in outputs)
                    bad["repeated_request"] += len(outputs) - len({o.request_id for o in outputs})
                    outputs = None
                    add()  # before the Abort, so the core never runs fewer than N
                    streams.pop(order.popleft()).abort()
            bad["missing_steps"] = steps - len(recv_ns)
            to_core_send.send_nowait(w.Shutdown())
            to_core_send.close()
        await proc.wait()
    await conn.aclose()
    if proc.returncode != 0:
        raise RuntimeError(f"the {transport} child exited with {proc.returncode}")
    side = json.loads(report.read_text())
    skip = min(20, steps // 10)
    measured = len(recv_ns) - 1 - skip  # steps from the first stamp after warmup to the last

    def per_step(xs: list, scale: float = 1e6) -> float:
        return (xs[-1] - xs[skip]) * scale / measured if measured > 0 else math.nan

    def mean_us(a: list[int], b: list[int]) -> float:
        d = [(y - x) / 1e3 for x, y in zip(a[skip:], b[skip:], strict=False)]
        return sum(d) / len(d) if d else math.nan

    lat = sorted((r - s) / 1e3 for r, s in zip(recv_ns[skip:], side["ready_ns"][skip:],
                                                  strict=False))
    pct = {"mean": sum(lat) / len(lat), "max": lat[-1]} if lat else None
    for q in (50, 99) if lat else ():
        pct[f"p{q}"] = lat[min(len(lat) - 1, len(lat) * q // 100)]
    return {
        "transport": transport, "mode": mode, "status": "ok", "streams": n, "steps": steps,
        "interval_ms": interval, "steps_per_s": 1e9 / per_step(recv_ns, 1),
        "frame_bytes": conn.bytes_in / max(1, len(recv_ns)),
        "child_cpu_us_per_step": per_step(side["cpu_s"]),
        "parent_cpu_us_per_step": per_step(cpu),
        "child_encode_us": mean_us(side["ready_ns"], side["encoded_ns"]),
        "child_write_us": mean_us(side["encoded_ns"], side["sent_ns"]),
        "latency_us": pct, "mismatches": dict(bad), "mismatch_total": sum(bad.values()),
    }


async def run_all(args: argparse.Namespace) -> list[dict]:
    transports = ["pipe", "zmq"] if args.transport == "both" else [args.transport]
    modes = ["saturated", "paced"] if args.mode == "both" else [args.mode]
    results = []
    with tempfile.TemporaryDirectory(prefix="izh-bt-") as tmp:
        # Transports take turns, so a noisy neighbour hits both alike.
        for _, mode, transport in itertools.product(range(args.repeat), modes, transports):
            if transport == "zmq" and _zmq() is None:
                results.append({"transport": "zmq", "mode": mode, "status": "skipped",
                                "reason": "pyzmq is not installed (pip install pyzmq)"})
            else:
                results.append(await measure(transport, mode, args, Path(tmp)))
    return results


def medians(results: list[dict]) -> list[dict]:
    """One row per transport and mode: the median of each figure over the repeats."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        if r["status"] == "ok":
            groups.setdefault((r["transport"], r["mode"]), []).append(r)
    rows = []
    for (transport, mode), rs in groups.items():
        row = {k: statistics.median(r[k] for r in rs) for k, v in rs[0].items()
               if isinstance(v, int | float)}
        row["latency_us"] = {q: statistics.median(r["latency_us"][q] for r in rs)
                             for q in rs[0]["latency_us"]} if rs[0]["latency_us"] else None
        rows.append({**row, "transport": transport, "mode": mode, "status": "ok",
                     "runs": len(rs), "mismatch_total": sum(r["mismatch_total"] for r in rs)})
    return rows


def print_table(results: list[dict]) -> None:
    cols = ("steps/s", "core us", "front us", "encode", "write", "lat mean", "p50", "p99",
            "KiB/step", "bad")
    print(f"{'transport':<9} {'mode':<9}" + "".join(f"{c:>9}" for c in cols))
    for r in results:
        if r["status"] != "ok":
            print(f"{r['transport']:<9} {r['mode']:<9} skipped: {r['reason']}")
            continue
        lat = r["latency_us"] or dict.fromkeys(("mean", "p50", "p99"), math.nan)
        row = (r["steps_per_s"], r["child_cpu_us_per_step"], r["parent_cpu_us_per_step"],
               r["child_encode_us"], r["child_write_us"], lat["mean"], lat["p50"], lat["p99"],
               r["frame_bytes"] / 1024)
        print(f"{r['transport']:<9} {r['mode']:<9}" + "".join(f"{x:>9.1f}" for x in row)
              + f"{r['mismatch_total']:>9}")
    print("core/front us: CPU per step of the child/parent process; encode, write: wall us in"
          " the child; lat: outputs ready in the child -> decoded and fanned out, us")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transport", choices=("pipe", "zmq", "both"), default="both")
    p.add_argument("--mode", choices=("saturated", "paced", "both"), default="both")
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--steps", type=int, default=2000, help="steps of a saturated run")
    p.add_argument("--paced-steps", type=int, default=300, help="steps of a paced run")
    p.add_argument("--interval-ms", type=float, default=35.0, help="step time of a paced run")
    p.add_argument("--repeat", type=int, default=1, help="runs of each transport and mode")
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument("--child", type=json.loads, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        return child(args.child)
    results = trio.run(run_all, args)
    print_table(results)
    summary = medians(results)
    if args.repeat > 1:
        print(f"\nmedians over {args.repeat} runs:")
        print_table(summary)
    if args.json:
        env = {"python": platform.python_version(), "cpus": os.cpu_count(),
               "pyzmq": getattr(_zmq(), "__version__", None)}
        config = {k: getattr(args, k) for k in ("transport", "mode", "streams", "steps",
                                                "paced_steps", "interval_ms", "repeat")}
        args.json.write_text(json.dumps({"config": config, "env": env, "results": results,
                                         "medians": summary}, indent=2))
    return 3 if any(r.get("mismatch_total") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
