"""A constraint the grammar library stops enforcing mid-output is an error, never a 'stop'.

llguidance bounds its work (lexer states, fuel per step); a grammar that hits a bound while
the output is being written leaves only eos open in its mask. Reported as a normal ending,
that output would not satisfy its constraint. Here a small bound on lexer states makes it
happen on a regex whose automaton grows with what is written.
"""

from __future__ import annotations

from pathlib import Path

import llguidance
import pytest
import torch

from izh_trio.engine.core import EngineCore
from izh_trio.engine.guided import ConstraintBroken, GuidedDecoding
from izh_trio.engine.sequence import Sequence
from izh_trio.frontend.structured import json_schema_grammar, regex_grammar
from izh_trio.wire import AddRequest, EngineConfig, RequestFailed, SamplingParams

#: Its automaton needs a state per distinct recent 11 letters: thousands, built as written.
GROWING = regex_grammar("(a|b)*a(a|b){10}", "x")
EOS = 1993
VOCAB = 2000


def _limited(tiny_dir: Path, states: int) -> GuidedDecoding:
    return GuidedDecoding(tiny_dir / "tokenizer.json", VOCAB, (EOS,),
                          limits=llguidance.LLParserLimits(max_lexer_states=states))


def _steers(guided: GuidedDecoding, request_id: str) -> bool:
    """``guided`` holds a grammar for ``request_id``: it masks that request's logits."""
    seq = Sequence(request_id=request_id, token_ids=[1, 2, 3], stop_token_ids=frozenset({EOS}),
                   params=SamplingParams())
    logits = torch.zeros(1, VOCAB)
    return guided.mask(logits, [seq]) is not logits


@pytest.mark.parametrize("seed", range(3))
def test_a_matcher_failing_mid_output_raises(tiny_dir: Path, seed: int) -> None:
    guided = _limited(tiny_dir, 200)
    assert guided.add("r", GROWING, 400) is None
    assert _steers(guided, "r")
    seq = Sequence(request_id="r", token_ids=[1, 2, 3], stop_token_ids=frozenset({EOS}),
                   params=SamplingParams(max_tokens=400, grammar=GROWING))
    torch.manual_seed(seed)
    with pytest.raises(ConstraintBroken, match="too many states"):
        for _ in range(400):
            logits = torch.randn(1, VOCAB)
            logits[0, EOS] = -1e9  # never end by choice (unless nothing else is left)
            token = int(torch.distributions.Categorical(logits=guided.mask(logits, [seq])[0]
                                                        ).sample())
            tokens = [token]
            guided.keep_closable(tokens, [seq])
            seq.token_ids.append(tokens[0])
            assert not guided.accept("r", tokens[0])


def test_a_bound_hit_before_the_output_starts_is_an_admission_error(tiny_dir: Path) -> None:
    guided = _limited(tiny_dir, 40)
    grammar = json_schema_grammar({"type": "object", "properties": {"a": {"type": "string"}},
                                   "required": ["a"]}, "x")
    error = guided.add("r", grammar, 100)
    assert error is not None and error.startswith("the output constraint cannot be enforced")
    assert "\n" not in error  # the library's state dump stays inside
    assert not _steers(guided, "r")


def test_the_core_fails_that_request_alone_and_frees_it(tiny_dir: Path) -> None:
    core = EngineCore(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=128, block_size=8))
    core.guided = core.sampler._guided = _limited(tiny_dir, 100)
    doomed = SamplingParams(max_tokens=300, min_tokens=300, temperature=1.0, seed=3,
                            grammar=GROWING)
    assert core.add_request(AddRequest("doomed", [5, 6, 7], doomed)) is None
    assert core.add_request(AddRequest("plain", [5, 6, 7], SamplingParams(
        max_tokens=40, ignore_eos=True))) is None
    failures: list[RequestFailed] = []
    finished = {}
    while core.has_work:
        for out in core.step():
            assert out.request_id != "doomed" or out.finish_reason is None, out
            if out.finish_reason is not None:
                finished[out.request_id] = out
        failures += core.take_failures()
    assert [f.request_id for f in failures] == ["doomed"]
    assert not failures[0].rejected
    assert failures[0].message.startswith("the output constraint could not be enforced")
    assert finished["plain"].num_output_tokens == 40
    assert core.block_manager.usage == 0.0
    assert not _steers(core.guided, "doomed")
