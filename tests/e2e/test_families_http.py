"""Each model family served by the real server (hypercorn, the engine subprocess), checkpoints
made by transformers' own classes: greedy completions through the official ``openai`` client
equal transformers' ``generate`` decoded by ``AutoTokenizer``, sent one at a time and all at
once (a mixed batch: a short prompt, a long one prefilled in chunks, another)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import torch
import transformers

from tests.e2e.conftest import free_port, running_server, serve_args
from tests.engine.test_llama_qwen2 import PROMPTS, make_family

SHAPES = ("llama-mha-biases-llama3", "qwen2-yarn", "mistral-window-32", "qwen3-moe-8x2")
N = 12


@pytest.fixture(scope="module", params=SHAPES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           tiny_dir: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path_factory.mktemp("family-http")
    model_dir = make_family(request.param, root / request.param, tiny_dir,
                            initializer_range=0.1)
    port = free_port()
    args = serve_args(model_dir, port, "--served-model-name", "m",
                      "--max-num-batched-tokens", "64")
    with running_server(args, root / "server.log", port=port) as (base, _proc):
        yield model_dir, base


def _expected(model_dir: Path) -> list[str]:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    texts = []
    for ids in PROMPTS:
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=N, min_new_tokens=N,
                                 do_sample=False, pad_token_id=0)
        texts.append(tokenizer.decode(out[0, len(ids):].tolist()))
    return texts


def test_greedy_completions_equal_generate_alone_and_batched(family: tuple[Path, str]) -> None:
    model_dir, base = family
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=120)

    def complete(ids: list[int]) -> str:
        out = client.completions.create(model="m", prompt=ids, max_tokens=N, temperature=0,
                                        extra_body={"ignore_eos": True,
                                                    "skip_special_tokens": False})
        assert out.choices[0].finish_reason == "length"
        assert out.usage is not None and out.usage.completion_tokens == N
        return out.choices[0].text

    want = _expected(model_dir)
    assert [complete(ids) for ids in PROMPTS] == want
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        assert list(pool.map(complete, PROMPTS)) == want
