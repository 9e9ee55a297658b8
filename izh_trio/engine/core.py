"""The engine core: requests in, one step at a time, outputs out. No I/O here."""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from izh_trio.engine.block_manager import BlockManager
from izh_trio.engine.guided import ConstraintBroken, GuidedDecoding
from izh_trio.engine.logprobs import token_logprobs
from izh_trio.engine.lora.adapter import LoraError
from izh_trio.engine.model_runner import ModelRunner
from izh_trio.engine.sampler import Sampler
from izh_trio.engine.scheduler import ScheduledSeq, Scheduler, SchedulerConfig
from izh_trio.engine.sequence import Sequence
from izh_trio.engine.thread_plan import ThreadPlan
from izh_trio.wire import (
    ITERATION_TOKENS_BUCKETS,
    AddRequest,
    EngineConfig,
    FinishReason,
    LoadLora,
    LoraUpdated,
    ModelInfo,
    Ready,
    RequestFailed,
    RequestOutput,
    Stats,
    TokenLogprobs,
    UnloadLora,
)


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        torch.manual_seed(config.seed)
        self.config = config
        self.runner = ModelRunner(config)
        self.threads = ThreadPlan.for_config(config, self.runner.weight_bytes)
        self._threads_now = 0
        self.max_model_len = self.runner.max_model_len
        self.eos_token_ids = frozenset(self.runner.model_config.eos_token_ids)
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size)
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_model_len=self.max_model_len,
            ),
            self.block_manager,
            self.runner.lora.slots if self.runner.lora is not None else None,
        )
        self._lora_of: dict[str, int] = {}  # request id -> the adapter it holds
        cfg = self.runner.model_config
        self.guided = GuidedDecoding(Path(config.model_dir) / "tokenizer.json", cfg.vocab_size,
                                     cfg.eos_token_ids)
        self.sampler = Sampler(config.seed, self.guided)
        self.num_steps = 0
        #: Requests that broke during the last steps, to be reported (``take_failures``).
        self.failures: list[RequestFailed] = []
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.step_seconds_total = 0.0
        self.prompt_tokens_cached_total = 0
        #: Steps by tokens computed, per ``ITERATION_TOKENS_BUCKETS`` bound and one above.
        self.iteration_tokens = [0] * (len(ITERATION_TOKENS_BUCKETS) + 1)
        self.iteration_tokens_sum = 0
        self._lora_name_of: dict[str, str] = {}  # request id -> its adapter's name

    def ready(self) -> Ready:
        cfg = self.runner.model_config
        return Ready(
            max_model_len=self.max_model_len,
            model=ModelInfo(
                vocab_size=cfg.vocab_size,
                dtype=str(self.runner.dtype).removeprefix("torch."),
                eos_token_ids=cfg.eos_token_ids,
            ),
            num_kv_blocks=self.runner.num_blocks,
        )

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def add_request(self, req: AddRequest) -> RequestFailed | None:
        """Admit a request, or say why not; a bad request never disturbs the others."""
        problem = self._validate(req)
        if problem is None and req.params.grammar is not None:
            problem = self.guided.add(req.request_id, req.params.grammar,
                                      req.params.max_tokens)
        if problem is not None:
            return RequestFailed(req.request_id, problem)
        stop = set(req.params.stop_token_ids)
        if not req.params.ignore_eos:
            stop |= self.eos_token_ids
        lora, lora_id = self.runner.lora, None
        if req.lora_name is not None and lora is not None:
            lora_id = lora.lookup(req.lora_name)  # _validate found it loaded
            if lora_id is not None:
                lora.retain(lora_id)
                self._lora_of[req.request_id] = lora_id
                self._lora_name_of[req.request_id] = req.lora_name
        self.scheduler.add(Sequence(
            request_id=req.request_id,
            token_ids=list(req.prompt_token_ids),
            params=req.params,
            stop_token_ids=frozenset(stop),
            priority=req.priority,
            cache_salt=req.cache_salt,
            lora_id=lora_id,
        ))
        return None

    def _validate(self, req: AddRequest) -> str | None:
        n = len(req.prompt_token_ids)
        vocab = self.runner.model_config.vocab_size
        if req.request_id in self.scheduler.by_id:
            return f"request id {req.request_id!r} is already in use"
        if n == 0:
            return "the prompt is empty"
        if any(not 0 <= t < vocab for t in req.prompt_token_ids):
            return f"prompt token ids must be in [0, {vocab})"
        if any(t >= vocab for t in req.params.think_end):  # forced into the output
            return f"think_end token ids must be in [0, {vocab})"
        if n + req.params.max_tokens > self.max_model_len:
            return (f"this model's maximum context length is {self.max_model_len} tokens; "
                    f"the request asks for {n} prompt + {req.params.max_tokens} output tokens")
        lora = self.runner.lora
        if req.lora_name is not None and (lora is None or lora.lookup(req.lora_name) is None):
            return f"LoRA adapter {req.lora_name!r} is not loaded"
        return None

    def update_lora(self, op: LoadLora | UnloadLora) -> LoraUpdated:
        """Load or unload an adapter between steps; a failure changes nothing."""
        lora = self.runner.lora
        if lora is None or not self.config.lora_runtime_updates:
            return LoraUpdated(op.op_id, "LoRA runtime updates are not enabled")
        try:
            if isinstance(op, LoadLora):
                lora.load(op.name, op.path)
            else:
                lora.unload(op.name)
        except LoraError as exc:
            return LoraUpdated(op.op_id, str(exc))
        except Exception as exc:  # an unexpected file problem fails the update, not the core
            return LoraUpdated(op.op_id, f"LoRA adapter {op.name!r}: {exc!r}")
        return LoraUpdated(op.op_id)

    def abort(self, request_ids: tuple[str, ...]) -> None:
        for rid in request_ids:
            if self.scheduler.abort(rid) is not None:
                self._forget(rid)

    def _forget(self, request_id: str) -> None:
        self.sampler.forget(request_id)
        self.guided.forget(request_id)
        self._lora_name_of.pop(request_id, None)
        lora, lora_id = self.runner.lora, self._lora_of.pop(request_id, None)
        if lora is not None and lora_id is not None:
            lora.release(lora_id)

    def idle(self) -> None:
        """Called before the engine waits for work, which may be a while."""
        self.threads.idle()

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        threads = self.threads.for_batch(batch)
        switched = threads != self._threads_now
        if switched:
            torch.set_num_threads(threads)
            self._threads_now = threads
        self._count_iteration(batch)
        started = time.perf_counter()
        step = self.runner.execute(batch)
        seqs = [item.seq for item in step.sampling]
        sampled = self.sampler.sample(step.sample, seqs)
        seconds = time.perf_counter() - started
        self.threads.observe(batch, threads, seconds, switched)
        self.step_seconds_total += seconds
        tokens = dict(zip(seqs, zip(sampled.token_ids, sampled.logprobs, strict=True),
                          strict=True))
        for seq, logits in step.prompt.items():
            self._score_prompt(seq, logits)
        self.num_steps += 1
        outputs = []
        for item in batch:  # in schedule order, as the outputs go out
            token, logprobs = tokens.get(item.seq, (None, None))
            reason = self.scheduler.advance(item, token)
            if token is not None and (out := self._emit(item.seq, token, logprobs, reason)):
                outputs.append(out)
        return outputs

    def _count_iteration(self, batch: list[ScheduledSeq]) -> None:
        """The step's size for the iteration-tokens histogram; a request's first step."""
        now = time.monotonic()
        tokens = 0
        for item in batch:
            tokens += item.num_new_tokens
            if item.seq.scheduled_at is None:
                item.seq.scheduled_at = now
        self.iteration_tokens[bisect.bisect_left(ITERATION_TOKENS_BUCKETS, tokens)] += 1
        self.iteration_tokens_sum += tokens

    def take_failures(self) -> list[RequestFailed]:
        """The requests that broke while they ran since the last call (their blocks are
        already free)."""
        failures, self.failures = self.failures, []
        return failures

    def _emit(self, seq: Sequence, token: int, logprobs: TokenLogprobs | None,
              reason: FinishReason | None) -> RequestOutput | None:
        """Report the token a step sampled (the only new one); retire the sequence if done.
        None: the request broke instead (see ``take_failures``)."""
        try:
            if self.guided.accept(seq.request_id, token) and reason is not FinishReason.STOP:
                # The grammar is complete: nothing more may follow, even if the budget is spent.
                reason = FinishReason.STOP
        except ConstraintBroken as exc:  # never a "successful" answer that breaks the contract
            self.scheduler.finish(seq, FinishReason.ABORT)
            self._forget(seq.request_id)
            self.failures.append(RequestFailed(
                seq.request_id, f"the output constraint could not be enforced: {exc}",
                rejected=False))
            return None
        num_output = seq.num_output_tokens
        first = num_output == 1
        self.generation_tokens_total += 1
        timing = None
        if first:
            self.prompt_tokens_total += seq.num_prompt_tokens
            self.prompt_tokens_cached_total += seq.num_cached_tokens
            scheduled = seq.scheduled_at if seq.scheduled_at is not None else seq.added_at
            timing = (scheduled - seq.added_at, time.monotonic() - scheduled)
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self._forget(seq.request_id)
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=(token,),
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=num_output,
            num_cached_tokens=seq.num_cached_tokens,
            finish_reason=reason,
            stop_token_id=seq.stop_token_id,
            logprobs=(logprobs,) if logprobs is not None else None,
            prompt_logprobs=(tuple(seq.prompt_logprobs)
                             if first and seq.params.prompt_logprobs is not None else None),
            first_token_timing=timing,
        )

    def _score_prompt(self, seq: Sequence, logits: torch.Tensor) -> None:
        """Logprobs of the prompt tokens this chunk's logits predict (called before advance)."""
        k = seq.params.prompt_logprobs
        assert k is not None  # the runner keeps prompt logits only for requests that ask
        start = seq.num_computed_tokens  # row i predicts the token at start + i + 1
        targets = torch.tensor(seq.token_ids[start + 1 : start + 1 + logits.shape[0]],
                               device=logits.device)
        del seq.prompt_logprobs[start:]  # a chunk recomputed after preemption replaces its own
        seq.prompt_logprobs += token_logprobs(logits.log_softmax(dim=-1), targets, k)

    def stats(self) -> Stats:
        return Stats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.block_manager.usage,
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self.num_steps,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            prefix_cache_queries=self.block_manager.prefix_queries,
            prefix_cache_hits=self.block_manager.prefix_hits,
            step_seconds_total=self.step_seconds_total,
            step_threads=self._threads_now,
            prompt_tokens_cached_total=self.prompt_tokens_cached_total,
            iteration_tokens=tuple(self.iteration_tokens),
            iteration_tokens_sum=self.iteration_tokens_sum,
            running_loras=self._loras_of(self.scheduler.running),
            waiting_loras=self._loras_of(self.scheduler.waiting),
        )

    def _loras_of(self, seqs: Iterable[Sequence]) -> tuple[str, ...]:
        names = self._lora_name_of
        if not names:
            return ()
        return tuple(sorted({names[s.request_id] for s in seqs if s.request_id in names}))
