"""LoRA flags and environment variables, and how a request's model/lora pick an adapter."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from izh_trio.cli import main
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.serving.intake import resolve_model, served_model
from izh_trio.frontend.settings import Settings


def test_cli_and_env_give_the_same_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr("izh_trio.cli.serve",
                        lambda settings, backlog: seen.append((settings, backlog)))
    main(["serve", "--lora-modules", "sql=/a/sql", "chat=rel/chat", "--max-loras", "1",
          "--max-lora-rank", "32", "--enable-lora-runtime-updates", "--backlog", "512"])
    env = Settings.from_env({"IZH_LORA_MODULES": "sql=/a/sql, chat=rel/chat",
                             "IZH_MAX_LORAS": "1", "IZH_MAX_LORA_RANK": "32",
                             "IZH_ENABLE_LORA_RUNTIME_UPDATES": "true"})
    assert seen == [(env, 512)]
    assert env.lora_modules == (("sql", "/a/sql"), ("chat", "rel/chat"))
    config = env.engine_config(Path("/m"))
    assert config.lora_modules[0] == ("sql", "/a/sql")
    assert config.lora_modules[1][1].endswith("/rel/chat") and config.lora_modules[1][1][0] == "/"
    assert (config.max_loras, config.max_lora_rank, config.lora_runtime_updates) == (1, 32, True)
    assert Settings().engine_config(Path("/m")).lora_modules == ()


@pytest.mark.parametrize("bad", [["nameonly"], ["=/p"], ["a="], ["a=/x", "a=/y"]])
def test_bad_lora_modules_are_refused(bad: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises((SystemExit, ValueError)):
        main(["serve", "--lora-modules", *bad])
    with pytest.raises(ValueError):
        Settings(lora_modules=bad)


SERVER = SimpleNamespace(model_name="base", loras={"a": "/a", "b": "/b"})


@pytest.mark.parametrize(("model", "lora", "resolved"), [
    (None, None, ("base", None)),
    ("base", None, ("base", None)),
    ("a", None, ("a", "a")),
    (None, "b", ("b", "b")),
    ("base", "b", ("b", "b")),
    ("a", "a", ("a", "a")),
])
def test_model_and_lora_pick_the_adapter(model, lora, resolved) -> None:
    assert resolve_model(SERVER, model, lora) == resolved


@pytest.mark.parametrize(("model", "lora", "status", "param"), [
    ("nope", None, 404, "model"),
    (None, "nope", 404, "lora"),
    ("base", "base", 404, "lora"),
    ("a", "b", 400, "lora"),
])
def test_unknown_or_conflicting_adapters(model, lora, status: int, param: str) -> None:
    with pytest.raises(APIError) as info:
        resolve_model(SERVER, model, lora)
    assert (info.value.status, info.value.param) == (status, param)
    if status == 404:
        assert info.value.code == "model_not_found"


def test_tokenize_accepts_adapter_names() -> None:
    assert served_model(SERVER, "a") == "a"
    with pytest.raises(APIError):
        served_model(SERVER, "c")
