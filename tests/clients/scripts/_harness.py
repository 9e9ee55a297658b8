"""What every client script shares: a loopback-only network, bounded cases, one JSON report.

A script defines ``case_<name>(obs)`` functions (sync or async) and ends with
``run_cases(globals(), [packages to report versions of])``. Each case records what came back
in ``obs`` and asserts; the report (on stdout, the only thing written there) maps each case
to ``ok``, the error with its assertion text and the script lines it came from, and
``observed``. Sync cases run first with no event loop (some clients start their own), then
async ones in one loop (some clients cache async HTTP clients across calls).

Run by hand: ``.venv-clients/bin/python tests/clients/scripts/X_client.py BASE_URL MODEL``.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import json
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

# Set (over the caller's own) before any client library is imported: several read these at
# import time.
QUIET_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm fetches its price list at import
    "OPENAI_AGENTS_DISABLE_TRACING": "1",  # else traces go to OpenAI's backend
    "LANGCHAIN_TRACING_V2": "false",  # LangSmith
    "LANGSMITH_TRACING": "false",
    "HF_HUB_OFFLINE": "1",  # tokenizers some libraries load by name
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",  # no fork warnings on stderr
}
os.environ.update(QUIET_ENV)

#: One request's HTTP timeout; every client gets it, with retries off.
REQUEST_TIMEOUT = 60.0
#: A whole case, however many requests it makes (a stuck sync one gets SIGALRM, an async one
#: is cancelled).
CASE_TIMEOUT = 120
MAX_TEXT = 400  # observed strings are cut to this

Obs = dict[str, Any]

BLOCKED: list[str] = []  # non-loopback connections a library tried: reported, then refused


def args() -> tuple[str, str]:
    """``BASE_URL MODEL`` from the command line (the server's root URL, no ``/v1``)."""
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} BASE_URL MODEL")
    return sys.argv[1].rstrip("/"), sys.argv[2]


def _is_loopback(host: Any) -> bool:
    if host is None or host in ("localhost", b"localhost"):
        return True
    if isinstance(host, bytes):
        host = host.decode()
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _loopback_only() -> None:
    """Refuse every connection and name lookup that would leave 127.0.0.1, and note it."""
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def refuse(host: Any) -> OSError:
        BLOCKED.append(str(host))
        return OSError(f"client test: connections outside loopback are refused ({host})")

    def getaddrinfo(host: Any, *rest: Any, **kw: Any) -> Any:
        if not _is_loopback(host):
            raise refuse(host)
        return real_getaddrinfo(host, *rest, **kw)

    def target(address: Any) -> Any:
        return address[0] if isinstance(address, tuple) else None  # AF_UNIX: a path

    def connect(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(
                target(address)):
            raise refuse(target(address))
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(
                target(address)):
            raise refuse(target(address))
        return real_connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]
    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]


_loopback_only()


class CaseTimeout(BaseException):
    """Not an Exception: a library's broad ``except Exception`` must not swallow it."""


def _on_alarm(_signum: int, _frame: Any) -> None:
    raise CaseTimeout(f"the case ran past {CASE_TIMEOUT} s")


def cut(value: Any) -> Any:
    """A JSON-able, bounded copy of what a client returned, for the report."""
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + f"...[{len(value)} chars]"
    if isinstance(value, dict):
        return {str(k): cut(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [cut(v) for v in value[:20]]
    if value is None or isinstance(value, bool | int | float):
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return cut(dump(mode="json"))
        except Exception:  # some SDK objects do not dump; their repr still says what it was
            pass
    return cut(repr(value))


def _error_detail(exc: BaseException) -> str:
    """The exception with its message (status and body for HTTP errors) and the script's own
    frames with their source lines, so a bare ``assert`` still says what it tested."""
    lines = [f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"]
    for attr in ("status_code", "body"):
        if getattr(exc, attr, None) is not None:
            lines.append(f"  {attr}: {cut(getattr(exc, attr))}")
    cause = exc.__cause__ or exc.__context__
    if cause is not None and not isinstance(exc, AssertionError) and \
            getattr(exc, "status_code", None) is None:  # an HTTP error's cause repeats it
        lines.append(f"  caused by {type(cause).__qualname__}: {cut(str(cause))}")
    here = os.path.dirname(os.path.abspath(__file__))
    tb = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in tb if os.path.dirname(os.path.abspath(f.filename)) == here
              and os.path.basename(f.filename) != "_harness.py"]
    if tb and tb[-1] not in frames:  # where a library raised it
        frames.append(tb[-1])
    for f in frames[-5:]:
        lines.append(f"  at {os.path.basename(f.filename)}:{f.lineno}: {f.line}")
    return "\n".join(lines)


def _versions(names: list[str]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def run_cases(namespace: dict[str, Any], packages: list[str]) -> None:
    """Run every ``case_*`` of ``namespace`` and print the report; exit 0 whatever failed."""
    script = sys.argv[0]
    cases: list[tuple[str, Callable[..., Any]]] = [
        (name.removeprefix("case_"), fn) for name, fn in namespace.items()
        if name.startswith("case_") and callable(fn)]
    report_out = sys.stdout
    sys.stdout = sys.stderr  # libraries that print must not corrupt the report
    results: dict[str, Any] = {}
    signal.signal(signal.SIGALRM, _on_alarm)

    def record(name: str, obs: Obs, started: float, exc: BaseException | None) -> None:
        results[name] = {"ok": exc is None,
                         "error": None if exc is None else _error_detail(exc),
                         "observed": cut(obs), "seconds": round(time.monotonic() - started, 2)}
        status = "ok" if exc is None else "FAILED"
        print(f"[{status}] {name} ({results[name]['seconds']} s)", file=sys.stderr)

    for name, fn in cases:
        if inspect.iscoroutinefunction(fn):
            continue
        obs: Obs = {}
        started = time.monotonic()
        signal.alarm(CASE_TIMEOUT)
        try:
            fn(obs)
        except (Exception, CaseTimeout) as exc:
            record(name, obs, started, exc)
        else:
            record(name, obs, started, None)
        finally:
            signal.alarm(0)

    async def run_async() -> None:
        for name, fn in cases:
            if not inspect.iscoroutinefunction(fn):
                continue
            obs: Obs = {}
            started = time.monotonic()
            try:  # cancelled cleanly, unlike an alarm that lands in the loop's select
                await asyncio.wait_for(fn(obs), CASE_TIMEOUT)
            except TimeoutError as exc:
                late = time.monotonic() - started >= CASE_TIMEOUT
                record(name, obs, started, CaseTimeout(f"the case ran past {CASE_TIMEOUT} s")
                       if late else exc)
            except Exception as exc:
                record(name, obs, started, exc)
            else:
                record(name, obs, started, None)

    asyncio.run(run_async())
    ordered = {name: results[name] for name, _ in cases}  # as defined, not as run
    # A library that tried to reach the outside despite QUIET_ENV is a failure of its own.
    ordered["nothing_left_loopback"] = {
        "ok": not BLOCKED,
        "error": f"connections outside loopback were attempted: {BLOCKED}" if BLOCKED else None,
        "observed": {"blocked": BLOCKED}, "seconds": 0.0}
    report = {"script": os.path.basename(script), "versions": _versions(packages),
              "cases": ordered}
    report_out.write(json.dumps(report) + "\n")
    report_out.flush()
