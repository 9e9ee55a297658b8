"""Every message that crosses the frontend/engine pipe.

All are frozen attrs classes: a message is a value, built once and never edited on either side.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import attrs
from attrs import validators as v

from izh_trio.wire.converters import floats, ints, strs
from izh_trio.wire.log_format import FORMATS as LOG_FORMATS
from izh_trio.wire.options import ATTENTION_BACKENDS, CUDA_GRAPHS_MODES, DTYPES, check_lora_names
from izh_trio.wire.sampling import SamplingParams


def _lora_pairs(pairs: Iterable[Sequence[str]]) -> tuple[tuple[str, str], ...]:
    """(name, path) pairs, checked (``check_lora_names``) before they are taken as pairs."""
    given = tuple(tuple(pair) for pair in pairs)
    check_lora_names(given)
    return tuple((name, path) for name, path in given)


class FinishReason(enum.Enum):
    STOP = "stop"  # an eos or stop token (or a stop string, found by the frontend)
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # the frontend asked


@attrs.frozen
class EngineConfig:
    """How the frontend asks the core to run; sent once, on the child's command line."""

    model_dir: str
    max_model_len: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    max_num_seqs: int = attrs.field(default=256, validator=v.ge(1))
    max_num_batched_tokens: int = attrs.field(default=2048, validator=v.ge(1))
    block_size: int = attrs.field(default=16, validator=v.ge(1))
    #: Explicit block count; when None it is derived from ``kv_cache_bytes``.
    num_kv_blocks: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    kv_cache_bytes: int = attrs.field(default=1 << 30, validator=v.ge(1))
    dtype: str = attrs.field(default="auto", validator=v.in_(DTYPES))
    device: str = "cpu"
    seed: int = 0
    #: Torch intra-op threads in the core; 0 leaves torch's default.
    num_threads: int = attrs.field(default=0, validator=v.ge(0))
    #: Paged attention: ``triton`` kernels or plain ``torch``; ``auto`` = triton on CUDA only.
    attention_backend: str = attrs.field(default="auto", validator=v.in_(ATTENTION_BACKENDS))
    #: CUDA graphs for pure-decode steps (triton backend only); ``auto`` = on for CUDA.
    cuda_graphs: str = attrs.field(default="auto", validator=v.in_(CUDA_GRAPHS_MODES))
    #: On CUDA, the fraction of the GPU's memory the core may use: weights, activations and a
    #: KV cache sized to fill the rest (unless ``num_kv_blocks`` is given). ``kv_cache_bytes``
    #: sizes the cache only on the CPU.
    gpu_memory_utilization: float = attrs.field(default=0.9, validator=[v.gt(0.0), v.le(1.0)])
    #: LoRA adapters loaded at start: (name, PEFT adapter directory) pairs, names unique.
    lora_modules: tuple[tuple[str, str], ...] = attrs.field(
        default=(), converter=_lora_pairs)
    #: Adapters resident in the model's LoRA slots at once; None: one per adapter loaded at
    #: start (8 at most; never more than those without runtime updates), or 8 with runtime
    #: updates. More adapters take turns: the least recently used idle one is swapped out.
    max_loras: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    #: The slots' rank; None: the largest rank loaded at start (16 at least with updates).
    max_lora_rank: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    #: Accept ``LoadLora`` / ``UnloadLora`` while serving.
    lora_runtime_updates: bool = False
    #: The core's log lines: ``text`` or ``json``, as the frontend's (``wire.log_format``).
    log_format: str = attrs.field(default="text", validator=v.in_(LOG_FORMATS))


# ---------------------------------------------------------------- frontend -> core


@attrs.frozen
class AddRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...] = attrs.field(converter=ints)
    params: SamplingParams
    #: Lower runs first, as in vLLM.
    priority: int = 0
    #: Mixed into the prefix-cache hash chain: requests with different salts never share blocks.
    cache_salt: str | None = None
    #: The LoRA adapter to run this request with (a loaded adapter's name); None: the base.
    lora_name: str | None = None


@attrs.frozen
class Abort:
    request_ids: tuple[str, ...] = attrs.field(converter=strs)


@attrs.frozen
class Shutdown:
    pass


@attrs.frozen
class LoadLora:
    """Load (or replace) LoRA adapter ``name`` from ``path``; answered by ``LoraUpdated``."""

    op_id: str
    name: str
    path: str


@attrs.frozen
class UnloadLora:
    """Unload adapter ``name``: new requests can't use it; running ones finish with it."""

    op_id: str
    name: str


# ---------------------------------------------------------------- core -> frontend


@attrs.frozen
class ModelInfo:
    """What the frontend needs of the model: token ranges, grammars, the fingerprint."""

    vocab_size: int
    dtype: str
    eos_token_ids: tuple[int, ...] = attrs.field(converter=ints)


@attrs.frozen
class Ready:
    max_model_len: int
    model: ModelInfo
    #: The KV cache's blocks, as sized at start (``cache_config_info``).
    num_kv_blocks: int = 0


@attrs.frozen
class TokenLogprobs:
    """The model's raw log-probability of one token, its rank, and the top alternatives."""

    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top_ids: tuple[int, ...] = attrs.field(default=(), converter=ints)
    top_logprobs: tuple[float, ...] = attrs.field(default=(), converter=floats)


@attrs.frozen
class RequestOutput:
    """What one step did for one request. Token ids are only the new ones."""

    request_id: str
    new_token_ids: tuple[int, ...] = attrs.field(converter=ints)
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0
    finish_reason: FinishReason | None = None
    #: The eos or stop token that ended it; None when it ended any other way.
    stop_token_id: int | None = None
    #: One entry per new token, when the request asked for logprobs.
    logprobs: tuple[TokenLogprobs, ...] | None = None
    #: Sent once, with the first token: one entry per prompt position after the first.
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None
    #: Sent once, with the first token, measured in the core: seconds from its arrival to
    #: its first step (queue), and from there to its first token (prefill).
    first_token_timing: tuple[float, float] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


if TYPE_CHECKING:
    # a typed view of the builtin, as in ``wire.converters`` (one frame per step is built)
    def _outputs(values: Iterable[RequestOutput], /) -> tuple[RequestOutput, ...]: ...
else:
    _outputs = tuple


@attrs.frozen
class StepOutputs:
    outputs: tuple[RequestOutput, ...] = attrs.field(converter=_outputs)


@attrs.frozen
class RequestFailed:
    """One request failed in the core; every other request goes on. ``rejected``: it was
    refused at admission (the client's input); else it broke while it ran."""

    request_id: str
    message: str
    rejected: bool = True


#: Upper bounds of ``Stats.iteration_tokens``'s buckets (vLLM's ``iteration_tokens_total``).
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@attrs.frozen
class Stats:
    num_running: int
    num_waiting: int
    #: Fraction of KV blocks referenced by live requests (0 when idle).
    kv_cache_usage: float
    num_preemptions: int
    num_steps: int
    #: Cumulative, counted where the work happens: prompts of requests that produced a token,
    #: and every token sampled (aborted requests' included).
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    #: Prompt tokens looked up in the prefix cache, and how many of them were found.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    #: Seconds spent in steps (the model and the sampler), and the torch threads of the last.
    step_seconds_total: float = 0.0
    step_threads: int = 0
    #: Prompt tokens of started requests that the prefix cache held (counted with the prompt).
    prompt_tokens_cached_total: int = 0
    #: Steps by the tokens they computed: one count per ``ITERATION_TOKENS_BUCKETS`` bound
    #: (not cumulative) and one above the last; and those tokens' sum.
    iteration_tokens: tuple[int, ...] = attrs.field(default=(), converter=ints)
    iteration_tokens_sum: int = 0
    #: The LoRA adapters of the running and of the waiting requests, sorted.
    running_loras: tuple[str, ...] = attrs.field(default=(), converter=strs)
    waiting_loras: tuple[str, ...] = attrs.field(default=(), converter=strs)


@attrs.frozen
class LoraUpdated:
    """The answer to ``LoadLora`` / ``UnloadLora``: ``error`` is None when it was done."""

    op_id: str
    error: str | None = None


@attrs.frozen
class Fatal:
    """The core's state can no longer be trusted; it exits after sending this."""

    message: str


ToCore = AddRequest | Abort | Shutdown | LoadLora | UnloadLora
FromCore = Ready | StepOutputs | RequestFailed | Stats | Fatal | LoraUpdated
Message = ToCore | FromCore
