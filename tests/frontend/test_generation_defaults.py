"""A checkpoint's ``generation_config.json`` sets the sampling a request leaves unset, as
far as its values are ones a request could give."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from izh_trio.frontend.tokenizer import GenerationDefaults


def _defaults(tmp_path: Path, config: dict[str, object]) -> GenerationDefaults:
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps(config))
    return GenerationDefaults.from_file(path)


def test_a_missing_file_is_neutral_sampling(tmp_path: Path) -> None:
    assert GenerationDefaults.from_file(tmp_path / "absent.json") == GenerationDefaults()


def test_usable_values_are_taken(tmp_path: Path) -> None:
    got = _defaults(tmp_path, {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
                               "repetition_penalty": 1.05, "bos_token_id": 1})
    assert got == GenerationDefaults(temperature=0.6, top_p=0.95, top_k=20, min_p=0.0,
                                     repetition_penalty=1.05)


def test_do_sample_false_is_greedy(tmp_path: Path) -> None:
    assert _defaults(tmp_path, {"do_sample": False, "temperature": 0.7}).temperature == 0.0


@pytest.mark.parametrize(("name", "value"), [
    ("temperature", -0.5), ("temperature", 7), ("top_p", 0), ("top_p", 1.5), ("top_k", -3),
    ("min_p", 2.0), ("repetition_penalty", 0), ("temperature", True), ("top_p", "0.9"),
    ("top_k", [40]),
])
def test_values_a_request_could_not_give_are_logged_and_left_neutral(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, value: object) -> None:
    with caplog.at_level(logging.WARNING, logger="izh_trio.frontend.tokenizer"):
        got = _defaults(tmp_path, {name: value, "top_k": 50} if name != "top_k"
                        else {name: value})
    assert getattr(got, name) == getattr(GenerationDefaults(), name)
    if name != "top_k":
        assert got.top_k == 50  # the usable ones around it are kept
    assert f"{name}={value!r}" in caplog.text
