"""The Anthropic TypeScript SDK (@anthropic-ai/sdk) on Node 20+ against the server's Messages
API: see node/anthropic_client.mjs."""

from __future__ import annotations

import pytest

from tests.clients.reports import MODULE_TIMEOUT, NODE_DIR, ClientReport, case_names, run_client

SCRIPT = NODE_DIR / "anthropic_client.mjs"
pytestmark = pytest.mark.timeout(MODULE_TIMEOUT)


@pytest.fixture(scope="module")
def report(node_client: list[str], client_server: str) -> ClientReport:
    return run_client(SCRIPT.name, [*node_client, str(SCRIPT)], client_server, NODE_DIR)


@pytest.mark.parametrize("case", case_names(SCRIPT))
def test_node_anthropic(report: ClientReport, case: str) -> None:
    report.check(case)
