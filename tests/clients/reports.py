"""Run one client script against the server and check its report, case by case.

A script prints one JSON report (see scripts/_harness.py); a test module runs it once, in a
module-scoped fixture, and has one parametrized test per case, named from the script's own
``case_*`` functions, so a failure names the case and shows what came back.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPTS = HERE / "scripts"
NODE_DIR = HERE / "node"
MODEL = "qwen3-test"
#: The harness's own last case: no library tried to reach past loopback.
LOOPBACK_CASE = "nothing_left_loopback"
#: One script's whole run. Its cases are bounded on their own (scripts/_harness.py); this only
#: catches a script that hangs outside them.
SCRIPT_TIMEOUT = 420
#: A test module's per-test limit: its first test also waits for the venv or node_modules
#: (a first build downloads ~130 wheels), the server and the script run.
MODULE_TIMEOUT = 1200

_CASE = re.compile(r"^(?:export\s+)?(?:async\s+)?(?:def|function)\s+case_(\w+)", re.MULTILINE)


def case_names(script: Path) -> list[str]:
    """The cases a script defines, read from its source: at collection time the client
    environment may not exist yet."""
    return [*_CASE.findall(script.read_text()), LOOPBACK_CASE]


def client_env(base_url: str) -> dict[str, str]:
    """The scripts' environment: nothing that points a library at the outside."""
    env = {k: v for k, v in os.environ.items()
           if not k.lower().endswith("_proxy")
           and not k.startswith(("OPENAI_", "LITELLM_", "ANTHROPIC_"))}
    return {**env, "NO_PROXY": "127.0.0.1,localhost", "OPENAI_API_KEY": "unused",
            # a client built without an explicit base URL still lands on the server
            "OPENAI_BASE_URL": base_url + "/v1", "PYTHONDONTWRITEBYTECODE": "1"}


class ClientReport:
    def __init__(self, name: str, data: dict[str, Any], stderr: str) -> None:
        self.name, self.data, self.stderr = name, data, stderr

    def check(self, case: str) -> None:
        result = self.data["cases"].get(case)
        if result is None:
            pytest.fail(f"{self.name} reported no case {case!r}; its stderr ends:\n"
                        f"{self.stderr[-3000:]}", pytrace=False)
        if not result["ok"]:
            observed = json.dumps(result["observed"], indent=1, ensure_ascii=False)
            pytest.fail(f"{self.name} {case}: {result['error']}\nobserved: {observed}\n"
                        f"versions: {self.data.get('versions')}", pytrace=False)


def run_client(name: str, command: list[str], base_url: str, cwd: Path) -> ClientReport:
    """Run ``command BASE_URL MODEL``; its stdout is the report."""
    try:
        done = subprocess.run([*command, base_url, MODEL], cwd=cwd, env=client_env(base_url),
                              capture_output=True, text=True, timeout=SCRIPT_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        pytest.fail(f"{name} ran past {SCRIPT_TIMEOUT} s; stderr ends:\n{stderr[-3000:]}",
                    pytrace=False)
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"{name} exited {done.returncode} without a report; stdout:\n"
                    f"{done.stdout[-2000:]}\nstderr:\n{done.stderr[-4000:]}", pytrace=False)
    return ClientReport(name, data, done.stderr)


def run_python_client(python: Path, script: Path, base_url: str) -> ClientReport:
    return run_client(script.name, [str(python), str(script)], base_url, SCRIPTS)
