"""``izh-trio serve --lora-modules``: adapters listed, selected per request, against peft."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from jsonschema import Draft202012Validator
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from tests.conftest import save_transformers_qwen3
from tests.e2e.conftest import free_port, running_server, serve_args
from tests.lora_helpers import ALL_SEVEN, ATTENTION_QV, greedy, merged_model, save_peft_lora

BASE = "base-model"
PROMPT = [11, 400, 7, 1500, 33, 2, 901, 45, 12]
GREEDY = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
SPEC = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "openapi.json").read_text())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-e2e")
    base = save_transformers_qwen3(root / "base", tiny_dir, seed=3, initializer_range=0.1)
    return {"base": base,
            "a": save_peft_lora(root / "a", base, r=4, alpha=8, targets=ATTENTION_QV, seed=1),
            "b": save_peft_lora(root / "b", base, r=8, alpha=16, targets=ALL_SEVEN, seed=2)}


@pytest.fixture(scope="module")
def expected(checkpoints: dict[str, Path]) -> dict[str, str]:
    """peft's merged models' greedy text, decoded as the server decodes."""
    tokenizer = Tokenizer.from_file(str(checkpoints["base"] / "tokenizer.json"))
    adapter = {"base": None, "a": checkpoints["a"], "b": checkpoints["b"]}
    return {name: tokenizer.decode(greedy(merged_model(checkpoints["base"], path), PROMPT, 16))
            for name, path in adapter.items()}


@pytest.fixture(scope="module")
def lora_server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[str]:
    port = free_port()
    args = serve_args(checkpoints["base"], port, "--served-model-name", BASE, "--lora-modules",
                      f"a={checkpoints['a']}", f"b={checkpoints['b']}",
                      "--enable-lora-runtime-updates")
    log = tmp_path_factory.mktemp("lora-e2e-logs") / "server.log"
    with running_server(args, log, port=port) as (base, _proc):
        yield base


def complete(server: str, **body: object) -> httpx.Response:
    return httpx.post(server + "/v1/completions", json={**GREEDY, **body}, timeout=60)


def validate(schema: str, instance: object) -> None:
    Draft202012Validator({"$ref": f"#/components/schemas/{schema}",
                          "components": SPEC["components"]}).validate(instance)


def test_models_lists_the_adapters(lora_server: str, checkpoints: dict[str, Path]) -> None:
    body = httpx.get(lora_server + "/v1/models", timeout=10).json()
    validate("ModelList", body)
    cards = {card["id"]: card for card in body["data"]}
    assert list(cards) == [BASE, "a", "b"]
    assert cards[BASE]["parent"] is None
    for name in ("a", "b"):
        assert cards[name]["parent"] == BASE and cards[name]["object"] == "model"
        assert cards[name]["root"] == str(checkpoints[name])


def test_adapters_by_model_or_lora_field_match_peft(lora_server: str,
                                                    expected: dict[str, str]) -> None:
    assert expected["a"] != expected["base"] != expected["b"]
    for name in ("a", "b"):
        for how in ({"model": name}, {"lora": name}, {"model": name, "lora": name}):
            r = complete(lora_server, **how)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == name
            assert r.json()["choices"][0]["text"] == expected[name], how
    base = complete(lora_server).json()
    assert base["model"] == BASE and base["choices"][0]["text"] == expected["base"]
    # Streamed, and several prompts with adapters batched in the engine at once.
    with httpx.stream("POST", lora_server + "/v1/completions", timeout=60,
                      json={**GREEDY, "model": "b", "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events) == expected["b"]
    both = complete(lora_server, prompt=[PROMPT, PROMPT], n=2, lora="a").json()
    assert [c["text"] for c in both["choices"]] == [expected["a"]] * 4


def test_chat_with_an_adapter(lora_server: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "temperature": 0, "ignore_eos": True}
    outs = {}
    for key, how in (("model", {"model": "b"}), ("lora", {"lora": "b"}), ("base", {})):
        r = httpx.post(lora_server + "/v1/chat/completions", json={**body, **how}, timeout=60)
        assert r.status_code == 200, r.text
        outs[key] = r.json()["choices"][0]["message"]
    assert outs["model"] == outs["lora"] != outs["base"]


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "nope"}, 404, "model"),
    ({"lora": "nope"}, 404, "lora"),
    ({"model": "a", "lora": "b"}, 400, "lora"),
])
def test_unknown_adapters_are_404s(lora_server: str, body: dict, status: int,
                                   param: str) -> None:
    r = complete(lora_server, **body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param
    if status == 404:
        assert error["code"] == "model_not_found"
    validate("ErrorResponse", r.json())
    assert httpx.get(lora_server + "/health", timeout=10).status_code == 200
    assert complete(lora_server, model="a").status_code == 200


def test_runtime_load_and_unload(lora_server: str, checkpoints: dict[str, Path],
                                 expected: dict[str, str], tmp_path: Path) -> None:
    url = lora_server + "/v1/"
    r = httpx.post(url + "load_lora_adapter", timeout=60,
                   json={"lora_name": "c", "lora_path": str(checkpoints["b"])})
    assert r.status_code == 200 and "added" in r.text
    assert [m["id"] for m in httpx.get(url + "models").json()["data"]] == [BASE, "a", "b", "c"]
    assert complete(lora_server, model="c").json()["choices"][0]["text"] == expected["b"]
    again = httpx.post(url + "load_lora_adapter", json={"lora_name": "c", "lora_path": "x"})
    assert again.status_code == 400 and "already" in again.json()["error"]["message"]
    missing = httpx.post(url + "load_lora_adapter",
                         json={"lora_name": "d", "lora_path": str(tmp_path)})
    assert missing.status_code == 400 and "'d'" in missing.json()["error"]["message"]
    assert httpx.post(url + "unload_lora_adapter", json={"lora_name": "c"}).status_code == 200
    assert complete(lora_server, model="c").status_code == 404
    gone = httpx.post(url + "unload_lora_adapter", json={"lora_name": "c"})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    assert httpx.post(url + "unload_lora_adapter", json={}).status_code == 400


def test_runtime_updates_are_404_when_off(server: str) -> None:
    for path, body in (("load_lora_adapter", {"lora_name": "x", "lora_path": "/x"}),
                       ("unload_lora_adapter", {"lora_name": "x"})):
        r = httpx.post(f"{server}/v1/{path}", json=body, timeout=10)
        assert r.status_code == 404, r.text
        validate("ErrorResponse", r.json())


def test_an_unsupported_adapter_fails_startup_by_name(checkpoints: dict[str, Path],
                                                      tmp_path: Path) -> None:
    bad = shutil.copytree(checkpoints["a"], tmp_path / "dora")
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    args = serve_args(checkpoints["base"], free_port(), "--lora-modules",
                      f"good={checkpoints['a']}", f"fancy={bad}")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert "LoRA adapter 'fancy'" in proc.stdout + proc.stderr
    assert "DoRA (use_dora) is not supported" in proc.stdout + proc.stderr


def test_metrics_name_the_lora_slots(lora_server: str) -> None:
    """vLLM's ``lora_requests_info``: the slots (8 with runtime updates), nothing running."""
    complete(lora_server, model="a").raise_for_status()
    text = httpx.get(lora_server + "/metrics", timeout=10).text
    (info,) = [s for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "izh:lora_requests_info"]
    assert info.labels == {"max_lora": "8", "waiting_lora_adapters": "",
                           "running_lora_adapters": ""}
    assert info.value > 0  # when it was read, as vLLM's
