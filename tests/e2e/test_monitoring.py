"""The monitoring kit in tools/deploy: a real Prometheus (Debian's package) scrapes a real
server and loads the alert rules; the Grafana dashboard and the rules query only names the
server serves, under both prefixes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import free_port, running_server, serve_args

DEPLOY = Path(__file__).resolve().parents[2] / "tools" / "deploy"
DASHBOARD = DEPLOY / "grafana-dashboard.json"
ALERTS = DEPLOY / "alerts.yaml"
MODEL = "qwen3-test"


@pytest.fixture(scope="module", params=["izh", "vllm"])
def prefixed_server(request: pytest.FixtureRequest, hf_dir: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    prefix = request.param
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / f"{prefix}-server.log"
    args = serve_args(hf_dir, port, "--served-model-name", MODEL, "--metrics-prefix", prefix,
                      "--response-store", f"sqlite:///{log.parent}/responses.sqlite3")
    with running_server(args, log, port=port) as (base, _proc):
        httpx.post(base + "/v1/completions", timeout=60,
                   json={"prompt": "A", "max_tokens": 3}).raise_for_status()
        yield prefix, base


def _served_names(base: str) -> set[str]:
    """Every name a query may use: families and their samples (``_bucket``, ``_total``...)."""
    text = httpx.get(base + "/metrics", timeout=5).text
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
    return names


def test_dashboard_queries_only_served_names(prefixed_server: tuple[str, str]) -> None:
    prefix, base = prefixed_server
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(dashboard["panels"]) >= 10 and all(exprs)
    queried = {f"{prefix}:{name}" for e in exprs
               for name in re.findall(r"\$\{prefix\}:([A-Za-z0-9_]+)", e)}
    # what the issue asks the dashboard to show
    for wanted in ("generation_tokens_total", "time_to_first_token_seconds_bucket",
                   "inter_token_latency_seconds_bucket", "e2e_request_latency_seconds_bucket",
                   "request_queue_time_seconds_bucket", "kv_cache_usage_perc",
                   "prefix_cache_hits_total", "request_aborts_total",
                   "request_refusals_total", "engine_restarts_total"):
        assert f"{prefix}:{wanted}" in queried, wanted
    missing = queried - _served_names(base)
    assert not missing
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {o["value"] for o in variables["prefix"]["options"]} == {"izh", "vllm"}


def test_alert_rules_query_only_served_names(prefixed_server: tuple[str, str]) -> None:
    prefix, base = prefixed_server
    names = set(re.findall(r"\bizh:([A-Za-z0-9_]+)", ALERTS.read_text()))
    assert names
    assert {f"{prefix}:{n}" for n in names} <= _served_names(base)


def _get(url: str, **params: str) -> Any:
    reply = httpx.get(url, params=params, timeout=5)
    reply.raise_for_status()
    return reply.json()["data"]


def _poll(what: str, check: Any, *, within: float = 90.0) -> Any:
    """``check()`` until it returns something truthy; ``within`` only bounds a hang."""
    deadline = time.monotonic() + within
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} was not reached within {within} s")
        time.sleep(0.2)
    return result


def test_prometheus_scrapes_the_server_and_loads_the_rules(
        prefixed_server: tuple[str, str], tmp_path: Path) -> None:
    prefix, base = prefixed_server
    prometheus = shutil.which("prometheus")
    promtool = shutil.which("promtool")
    if prometheus is None or promtool is None:
        pytest.skip("Prometheus is not installed (Debian: apt-get install prometheus)")
    check = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 5 rules found" in check.stdout
    rules = tmp_path / "alerts.yaml"
    rules.write_text(ALERTS.read_text().replace("izh:", f"{prefix}:"))
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{rules}']\n"
        "scrape_configs:\n"
        "  - job_name: izh-trio\n"
        f"    static_configs: [{{targets: ['{base.removeprefix('http://')}']}}]\n")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api/v1"
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        def target_up() -> bool:
            try:
                targets = _get(api + "/targets")["activeTargets"]
            except httpx.HTTPError:
                assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
                return False
            return any(t["health"] == "up" for t in targets)

        _poll("the scrape target up", target_up)
        series = _poll("the server's series in Prometheus", lambda: _get(
            api + "/query", query=f"{prefix}:num_requests_running")["result"])
        assert series[0]["metric"]["model_name"] == MODEL
        generated = _get(api + "/query", query=f"{prefix}:generation_tokens_total")["result"]
        assert float(generated[0]["value"][1]) >= 3  # the request the fixture made

        def rules_evaluated() -> list[dict[str, Any]]:
            loaded = [r for g in _get(api + "/rules")["groups"] for r in g["rules"]]
            return loaded if len(loaded) == 5 and all(
                r["health"] == "ok" for r in loaded) else []

        loaded = _poll("the alert rules evaluated", rules_evaluated)
        firing = [r["name"] for r in loaded if r["state"] != "inactive"]
        assert not firing  # an idle, healthy server sets none off
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
