"""A thinking budget: a think block that outruns its budget is closed by the engine.

A request with ``think_budget`` B and ``think_end`` E (Qwen3: ``</think>``, ``\\n\\n``) thinks
freely for B output tokens. If none of those was ``E[0]`` (the model did not close its block
itself), the tokens sampled at output positions B, B+1, ... B+len(E)-1 are replaced by E, one
per step; then sampling is free again. A forced token is an output token like any other: it
counts toward ``max_tokens``, may stop the request, and its logprob is reported under the
step's distribution.

The decision depends only on the output so far, so it needs no state and survives
preemption (a recomputed sequence keeps its output). Each step costs one comparison per
budgeted row; the first B outputs are looked through only at the len(E) forcing positions.
"""

from __future__ import annotations

from izh_trio.engine.sequence import Sequence


def forced_token(seq: Sequence) -> int | None:
    """The token this step must produce for ``seq``, or None when its sampling is free."""
    params = seq.params
    budget = params.think_budget
    if budget is None:
        return None
    k = seq.num_output_tokens - budget  # this step's token is output number budget + k
    if not 0 <= k < len(params.think_end):
        return None
    start = seq.num_prompt_tokens
    try:  # list.index: a scan in C, with no copy of the output
        seq.token_ids.index(params.think_end[0], start, start + budget)
    except ValueError:
        return params.think_end[k]  # the block was not closed within the budget
    return None


def force_think_end(tokens: list[int], seqs: list[Sequence]) -> bool:
    """Replace each sampled token (``tokens[i]`` for ``seqs[i]``) that its thinking budget
    forces; True if any changed."""
    replaced = False
    for i, seq in enumerate(seqs):
        if seq.params.think_budget is None:
            continue
        token = forced_token(seq)
        if token is not None and tokens[i] != token:
            tokens[i] = token
            replaced = True
    return replaced
