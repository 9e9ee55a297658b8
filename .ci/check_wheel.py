"""CI: the wheel works on its own, as a user who runs ``pip install izh_trio-*.whl`` gets it.

Builds the wheel from a copy of this checkout, installs it into a fresh virtual environment (its
dependencies resolved as the user's would be: torch is the CPU wheel pip finds on disk), and
then, from a directory outside the checkout and with no ``PYTHONPATH``, so that nothing can be
imported from the source tree:

* imports the package and checks it came from that environment;
* reads the CPU kernels' C sources from the package data and builds them;
* imports every module of the package (the Triton backend among them) and runs a Triton
  kernel (in Triton's interpreter without CUDA);
* serves the embedded tiny model with ``izh-trio serve`` (fresh caches: the checkpoint and
  the kernels are built from what the wheel holds) and checks ``/openapi.json`` (the
  checkout's document, byte for byte) and a completion.

Run by ``.ci/run`` with the project's venv: ``.venv/bin/python .ci/check_wheel.py``. Exits
non-zero, saying what failed, on the first failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Run inside the fresh environment: what the wheel holds besides Python modules, used.
IN_VENV = r"""
import os, sys
from pathlib import Path

import izh_trio
assert Path(izh_trio.__file__).is_relative_to(sys.prefix), f"imported {izh_trio.__file__}"

from izh_trio.engine import cbuild, cpu_argmax, cpu_attention, cpu_fused
for module in (cpu_attention, cpu_fused, cpu_argmax):
    assert module._KERNEL.source(), f"{module.__name__}: empty C source"
    # without a compiler the engine keeps torch's path: then there is nothing to build
    assert module.available() or cbuild.compiler() is None, f"{module.__name__} did not build"

import importlib, pkgutil
import torch
if not torch.cuda.is_available():  # read when triton decorates a kernel, so before importing it
    os.environ.setdefault("TRITON_INTERPRET", "1")
# every module of the wheel imports: the Triton backend (wherever the engine keeps it) with
# them; those that need an extra this plain install lacks (the server imports them only when
# configured to use them, e.g. tracing's [otel]) fail with that extra's module missing, only
NEEDS_EXTRA = {"izh_trio.frontend.request_trace": "opentelemetry"}
for info in pkgutil.walk_packages(izh_trio.__path__, "izh_trio."):
    if info.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as exc:
        if NEEDS_EXTRA.get(info.name) != (exc.name or "").split(".")[0]:
            raise
from izh_trio import kernels
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
k, v = torch.randn(3, 2, 8, device=device), torch.randn(3, 2, 8, device=device)
slots = torch.tensor([5, -1, 0], device=device)
caches = [torch.zeros(2, 4, 2, 8, device=device) for _ in range(4)]
kernels.store_kv(k, v, caches[0], caches[1], slots)
kernels.store_kv_ref(k, v, caches[2], caches[3], slots)
assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
print("in the fresh venv: every module imports; C and Triton kernels ok")
"""


def run(args: list[str | Path], cwd: Path | None = None,
        env: dict[str, str] | None = None) -> None:
    """A step, its output in CI's log; a failure names the command, not all its arguments."""
    words = [str(a) for a in args]
    code = subprocess.run(words, cwd=cwd, env=env).returncode
    if code:
        raise RuntimeError(f"{' '.join(words[:4])[:200]} ... exited {code}")


def export(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked and new, less the ignored) copied to
    ``dest``: setuptools ships whatever an earlier build left in ``build/`` or listed in
    ``*.egg-info/SOURCES.txt``, so the wheel is built where no earlier build was."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, check=True,
                            capture_output=True).stdout
    for name in filter(None, listed.split(b"\0")):
        src, dst = ROOT / os.fsdecode(name), dest / os.fsdecode(name)
        if src.is_symlink() or src.is_file():  # a tracked file may be deleted in the tree
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: dict[str, object] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@contextmanager
def serving(izh_trio: Path, cwd: Path, env: dict[str, str], log: Path) -> Iterator[str]:
    """``izh-trio serve`` on a free port until /health answers; SIGTERM afterwards."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen([izh_trio, "serve", "--port", str(port)], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300  # a cold start builds the checkpoint and kernels
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited {proc.returncode}")
            try:
                if request(base + "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not become healthy")
            time.sleep(0.2)
        yield base
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def check_served(base: str) -> None:
    status, body = request(base + "/openapi.json")
    assert status == 200, f"/openapi.json answered {status}: {body[:300]!r}"
    assert body == (ROOT / "schemas" / "openapi.json").read_bytes(), "/openapi.json differs"
    status, body = request(base + "/v1/completions",
                           {"prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
    assert status == 200, f"a completion answered {status}: {body[:300]!r}"
    out = json.loads(body)
    assert out["choices"][0]["finish_reason"] == "length", out
    assert out["usage"]["completion_tokens"] == 4 and isinstance(out["choices"][0]["text"], str)
    print("served from the wheel: /openapi.json and a completion ok")


def check(work: Path, log: Path) -> str:
    """Build, install, check; returns how long each part took."""
    start = time.monotonic()
    # the venv's setuptools (torch requires it): no isolated build env to fetch
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", work / "dist", export(work / "src")])
    (wheel,) = (work / "dist").glob("izh_trio-*.whl")
    built = time.monotonic()
    venv = work / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    # this pip installs into the new venv (which needs none of its own); skipping the
    # byte-compilation of torch's thousands of modules saves a third of the install
    run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install",
         "--quiet", "--no-compile", wheel])
    installed = time.monotonic()
    # outside the checkout, nothing of it on the path, caches of its own
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["IZH_CACHE_DIR"] = str(work / "cache")
    run([venv / "bin" / "python", "-I", "-c", IN_VENV], cwd=work, env=env)
    with serving(venv / "bin" / "izh-trio", work, env, log) as base:
        check_served(base)
    done = time.monotonic()
    return (f"build {built - start:.0f} s, venv install {installed - built:.0f} s, "
            f"checks {done - installed:.0f} s")


def main() -> int:
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="izh-wheel-"))
    log = work / "server.log"
    try:
        parts = check(work, log)
    except (AssertionError, RuntimeError, ValueError) as exc:
        print(f"wheel check FAILED: {exc!r}", file=sys.stderr)
        if log.exists():
            print(log.read_text()[-3000:], file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)  # ~2 GB, torch's mostly
    print(f"wheel check passed in {time.monotonic() - start:.0f} s ({parts}, and removing it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
