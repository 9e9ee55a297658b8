"""The OpenAI Agents SDK's default model (the Responses API) against the server: see
scripts/agents_responses_client.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clients.reports import (
    MODULE_TIMEOUT,
    SCRIPTS,
    ClientReport,
    case_names,
    run_python_client,
)

SCRIPT = SCRIPTS / "agents_responses_client.py"
pytestmark = pytest.mark.timeout(MODULE_TIMEOUT)


@pytest.fixture(scope="module")
def report(clients_python: Path, client_server: str) -> ClientReport:
    return run_python_client(clients_python, SCRIPT, client_server)


@pytest.mark.parametrize("case", case_names(SCRIPT))
def test_agents_responses(report: ClientReport, case: str) -> None:
    report.check(case)
