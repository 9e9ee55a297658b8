"""Client-library tests: the libraries' own environments, built once, and one real server.

The libraries do not install beside the project's test extras (llama-index-llms-openai,
under OpenAILike, pins openai<3 where the project runs openai 3; together they bring ~130
packages the project does not need), so they get their own venv, ``.venv-clients``, from the
exact pins of requirements.txt, and the npm client its own node_modules from the committed
package-lock.json. Each is rebuilt when missing or when its
pin file changed (a hash of that file is kept inside it); a lock on the pin file keeps two
test runs from building at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.clients.reports import MODEL, NODE_DIR, REPO
from tests.e2e.conftest import free_port, running_server, serve_args

REQUIREMENTS = Path(__file__).resolve().parent / "requirements.txt"
VENV = REPO / ".venv-clients"
BUILD_TIMEOUT = 900  # s: a cold pip download of the whole set, or npm ci


def _digest(path: Path, runtime: str) -> str:
    """The pin file's hash, with the runtime it was installed for."""
    return hashlib.sha256(f"{runtime}\n".encode() + path.read_bytes()).hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(args: list[str], cwd: Path, what: str) -> None:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        pytest.fail(f"{what} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                    f"{done.stderr[-3000:]}", pytrace=False)


@pytest.fixture(scope="session")
def clients_python() -> Path:
    """``.venv-clients/bin/python``, with requirements.txt installed."""
    python = VENV / "bin" / "python"
    stamp = VENV / "requirements.sha256"
    with _locked(REQUIREMENTS):
        want = _digest(REQUIREMENTS, f"python {sys.version_info[:2]}")
        if python.exists() and stamp.exists() and stamp.read_text() == want:
            return python
        shutil.rmtree(VENV, ignore_errors=True)
        _build([sys.executable, "-m", "venv", str(VENV)], REPO, "creating .venv-clients")
        # Every package is pinned; --only-binary keeps a missing wheel from becoming a build.
        _build([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--only-binary", ":all:", "-r", str(REQUIREMENTS)], REPO,
               "installing tests/clients/requirements.txt")
        stamp.write_text(want)  # last: a build cut short is redone next time
    return python


@pytest.fixture(scope="session")
def node_client() -> list[str]:
    """The command that runs an npm client script (each test module adds its script), with
    node_modules from the lock file."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the npm packages' tests")
    major = subprocess.run([node, "-p", "process.versions.node.split('.')[0]"],
                           capture_output=True, text=True, timeout=30).stdout.strip()
    if not major.isdigit() or int(major) < 20:
        pytest.skip(f"node {major} is too old for the npm packages (20 or later)")
    lock = NODE_DIR / "package-lock.json"
    stamp = NODE_DIR / "node_modules" / ".izh-package-lock.sha256"
    with _locked(lock):
        want = _digest(lock, f"node {major}")
        if not (stamp.exists() and stamp.read_text() == want):
            # npm ci installs exactly the lock file, and fails if package.json disagrees.
            _build([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], NODE_DIR,
                   "npm ci in tests/clients/node")
            stamp.write_text(want)
    return [node]


@pytest.fixture(scope="package")  # gone once the client modules are done
def client_server(hub_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``izh-trio serve``, for every client module, on a checkpoint transformers wrote whole
    (weights and tokenizer files), with the chat markers flagged special in tokenizer.json as
    some hub checkpoints have them: a tool call must survive detokenizing too."""
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "clients-server.log"
    with running_server(serve_args(hub_dir, port, "--served-model-name", MODEL), log,
                        port=port) as (base, _proc):
        yield base
