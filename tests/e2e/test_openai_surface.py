"""The OpenAI surface through the official client, against the real server and engine."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch
import transformers

MODEL = "qwen3-test"
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(hf_dir: Path):
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    return model, transformers.AutoTokenizer.from_pretrained(hf_dir)


def test_chat_greedy_text_and_logprobs_match_transformers(client: openai.OpenAI,
                                                          reference) -> None:
    model, tok = reference
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name three rivers."}]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                         logprobs=True, top_logprobs=3, **GREEDY)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                  return_dict=False)
    ref = model.generate(torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12,
                         do_sample=False, output_scores=True, output_logits=True,
                         return_dict_in_generate=True)
    new = ref.sequences[0, len(ids):].tolist()
    choice = out.choices[0]
    assert choice.message.content == tok.decode(new, skip_special_tokens=True)
    assert choice.finish_reason == "length"
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 12
    for entry, logits, token in zip(choice.logprobs.content, ref.logits, new, strict=True):
        want = logits[0].float().log_softmax(-1)
        assert abs(entry.logprob - want[token].item()) < 1e-3
        assert len(entry.top_logprobs) == 3
        assert abs(entry.top_logprobs[0].logprob - want.max().item()) < 1e-3


def test_chat_stream_follows_openai_chunk_order(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Count."}],
                  max_completion_tokens=10, n=2, **GREEDY)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True,
                                                 stream_options={"include_usage": True}))
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert mine[0].delta.role == "assistant" and mine[0].delta.content == ""
        assert mine[-1].finish_reason == "length" and mine[-1].delta.content is None
        text = "".join(c.delta.content or "" for c in mine)
        assert text == whole.choices[index].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert whole.usage.completion_tokens == 20


def test_completions_batch_n_echo_and_logprobs(client: openai.OpenAI, reference) -> None:
    _, tok = reference
    prompts = ["The river", [15, 99, 1200]]
    out = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=5, echo=True,
                                    logprobs=2, **GREEDY)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    for c in out.choices:
        prompt = prompts[c.index // 2]
        prompt_text = prompt if isinstance(prompt, str) else tok.decode(prompt)
        assert c.text.startswith(prompt_text)
        lp = c.logprobs
        n_prompt = len(tok.encode(prompt_text)) if isinstance(prompt, str) else len(prompt)
        assert len(lp.tokens) == n_prompt + 5
        assert lp.token_logprobs[0] is None and all(x is not None for x in lp.token_logprobs[1:])
        assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert out.usage.prompt_tokens == len(tok.encode("The river")) + 3
    assert out.usage.completion_tokens == 20


def test_stop_strings_truncate_exactly(client: openai.OpenAI) -> None:
    base = dict(model=MODEL, prompt="Once upon a time there was", max_tokens=40, **GREEDY)
    full = client.completions.create(**base).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert len(stop.strip()) >= 1
    cut = full[: full.index(stop)]
    c = client.completions.create(**base, stop=[stop, "never-appears"]).choices[0]
    assert (c.text, c.finish_reason, c.model_extra["stop_reason"]) == (cut, "stop", stop)
    streamed = list(client.completions.create(**base, stop=stop, stream=True))
    assert "".join(ch.choices[0].text for ch in streamed) == cut
    assert streamed[-1].choices[0].finish_reason == "stop"
    kept = client.completions.create(**{**base, "extra_body": {
        "ignore_eos": True, "include_stop_str_in_output": True}}, stop=stop).choices[0]
    assert kept.text == cut + stop


def test_stop_token_ids_and_logit_bias(client: openai.OpenAI, reference) -> None:
    _, tok = reference
    token = tok.encode(" the")[0]
    forced = client.completions.create(model=MODEL, prompt="x", max_tokens=6, temperature=0,
                                       logit_bias={str(token): 100})
    assert forced.choices[0].text == tok.decode([token] * 6)
    # min_tokens=2 masks the stop token for two steps, so the bias only wins at the third.
    stopped = client.completions.create(
        model=MODEL, prompt="x", max_tokens=6, temperature=0, logit_bias={str(token): 100},
        logprobs=0, extra_body={"stop_token_ids": [token], "min_tokens": 2})
    c = stopped.choices[0]
    assert c.finish_reason == "stop" and c.model_extra["stop_reason"] == token
    assert stopped.usage.completion_tokens == 3
    first_two, last = c.logprobs.tokens[:2], c.logprobs.tokens[2]
    assert last == " the" and " the" not in first_two
    assert c.text == "".join(first_two)  # the stop token itself is not in the text


def test_seeded_sampling_is_batch_invariant_over_http(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, prompt="Seeds", max_tokens=16, temperature=1.0, top_p=0.95,
                  seed=77, extra_body={"ignore_eos": True, "top_k": 100})
    alone = client.completions.create(**kwargs).choices[0].text
    with ThreadPoolExecutor(8) as pool:
        noise = [pool.submit(client.completions.create, model=MODEL, prompt=f"noise {i}",
                             max_tokens=20, temperature=1.0) for i in range(6)]
        crowded = pool.submit(client.completions.create, **kwargs)
        assert crowded.result().choices[0].text == alone
        for f in noise:
            f.result()


def test_prefix_cache_reports_hits_and_honours_salt(client: openai.OpenAI) -> None:
    prompt = list(range(100, 700))
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == (len(prompt) - 1) // 16 * 16
    salted = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                                       extra_body={"cache_salt": "tenant-b"})
    assert salted.usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].text == first.choices[0].text


def test_continuous_usage_stats(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(
        model=MODEL, prompt="Count", max_tokens=5, stream=True, **GREEDY,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[-1] == 5


async def test_async_client(server: str) -> None:
    async with openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused",
                                  max_retries=0) as aclient:
        out = await aclient.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert out.usage.completion_tokens <= 3
        stream = await aclient.completions.create(model=MODEL, prompt="a", max_tokens=3,
                                                  stream=True)
        assert [c async for c in stream]


def test_request_id_is_echoed(server: str) -> None:
    r = httpx.post(server + "/v1/completions", json={"prompt": "a", "max_tokens": 1},
                   headers={"X-Request-Id": "trace-42"})
    assert r.headers["X-Request-Id"] == "trace-42" and r.json()["id"] == "trace-42"
    assert httpx.post(server + "/v1/completions",
                      json={"prompt": "a", "max_tokens": 1}).headers["X-Request-Id"]


def test_tokenize_and_detokenize(server: str, reference) -> None:
    _, tok = reference
    r = httpx.post(server + "/tokenize", json={"prompt": "hello world"}).json()
    assert r["tokens"] == tok.encode("hello world") and r["count"] == len(r["tokens"])
    msgs = [{"role": "user", "content": "hi"}]
    r = httpx.post(server + "/tokenize", json={"messages": msgs}).json()
    assert r["tokens"] == tok.apply_chat_template(msgs, add_generation_prompt=True,
                                                  tokenize=True, return_dict=False)
    back = httpx.post(server + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"] == tok.decode(r["tokens"])


@pytest.mark.parametrize(
    ("route", "body", "status", "param"),
    [
        ("chat/completions", {"messages": []}, 400, "messages"),
        ("chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "messages"),
        ("chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400,
         "messages"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "max_completion_tokens": 5000}, 400, "max_tokens"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "top_logprobs": 2}, 400, "top_logprobs"),
        ("completions", {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
        ("completions", {"prompt": "x", "logit_bias": {"5": 500}}, 400, "logit_bias"),
        ("completions", {"prompt": "x", "stop": 5}, 400, "stop"),
        ("completions", {"prompt": "x", "n": 0}, 400, "n"),
        ("completions", {"prompt": "x", "presence_penalty": 3}, 400, "presence_penalty"),
        ("completions", {"prompt": "x", "stop_token_ids": [10**6]}, 400, "stop_token_ids"),
        ("completions", {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
        # values that would overflow the engine pipe's 64-bit integers
        ("completions", {"prompt": "x", "seed": 2**64}, 400, "seed"),
        ("completions", {"prompt": "x", "priority": -(2**70)}, 400, "priority"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "top_k": 2**64}, 400, "top_k"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": []}, 400, "response_format"),
        ("completions", {"prompt": "x", "cache_salt": ""}, 400, "cache_salt"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "chat_template": "{{ messages[0].content }}"}, 400,
         "chat_template"),
    ],
)
def test_more_bad_requests(server: str, route: str, body: dict, status: int, param: str) -> None:
    r = httpx.post(f"{server}/v1/{route}", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
    assert httpx.get(server + "/health").status_code == 200
    ok = httpx.post(f"{server}/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert ok.status_code == 200  # and everyone else is still served
