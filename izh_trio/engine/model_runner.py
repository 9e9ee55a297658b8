"""Owns the model and the KV cache; turns a step plan into tensors and logits.

On CUDA the runner also sizes the KV cache from free GPU memory (``gpu_memory_utilization``,
after a profiling forward pass at the step-token budget measures activation memory) and, with
the triton attention backend, captures CUDA graphs for pure-decode steps (``cuda_graphs.py``).
With LoRA adapters it also holds their slot tensors (``lora/``), allocated before the KV cache
is sized; a step in which any token runs with an adapter runs eagerly, never as a graph.
"""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
import torch

from izh_trio.engine import cpu_argmax, models
from izh_trio.engine.attention import ChunkSpec, StepAttention, get_backend, long_tensor
from izh_trio.engine.cpu_linear import pack_linears
from izh_trio.engine.loader import iter_safetensors, resolve_dtype
from izh_trio.engine.lora.manager import LoraManager, lora_enabled
from izh_trio.engine.models import cpu_decode
from izh_trio.engine.models.base import DecoderStack
from izh_trio.engine.scheduler import ScheduledSeq
from izh_trio.engine.sequence import Sequence
from izh_trio.wire import EngineConfig

log = logging.getLogger(__name__)

#: Kept free on the GPU beyond the measured activation peak: graph pools, allocator slack.
CUDA_GRAPH_RESERVE_BYTES = 256 << 20


@attrs.frozen
class _StepInputs:
    input_ids: list[int]
    positions: list[int]
    attention: StepAttention
    sample_rows: list[int]
    sampling: list[ScheduledSeq]  # the items of ``sample_rows``, in order
    #: (seq, first row, rows) whose logits score the prompt's own next tokens
    prompt_rows: list[tuple[Sequence, int, int]]
    #: (LoRA slot, first row, rows) of each sequence that runs with an adapter
    lora_spans: list[tuple[int, int, int]]


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        model_dir = Path(config.model_dir)
        self.config = config
        self.model_config, model_class = models.resolve(model_dir)
        cfg = self.model_config
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)  # triton launches on the current device
        self.dtype = resolve_dtype(config.dtype, cfg.dtype, self.device)
        self.block_size = config.block_size
        self.attention = get_backend(config.attention_backend, self.device, self.dtype,
                                     windowed=cfg.sliding_window is not None)
        wanted_len = config.max_model_len or cfg.max_position_embeddings
        if wanted_len > cfg.max_position_embeddings:  # RoPE was trained up to there, no further
            raise ValueError(f"max_model_len {wanted_len} is longer than the checkpoint's "
                             f"max_position_embeddings ({cfg.max_position_embeddings})")

        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with self.device:
                self.model = model_class(cfg, max_positions=wanted_len)
        finally:
            torch.set_default_dtype(previous)
        self.model.load_weights(iter_safetensors(model_dir))
        self.model.eval()
        #: What a step reads at the least (a tied head once), before packing hides weights.
        self.weight_bytes = sum(p.nbytes for p in self.model.parameters())
        if self.device.type == "cpu":  # once loaded: the modules swapped in take its weights
            twins = self.model.use_cpu_twins(self.attention)
            log.info("%d modules on compiled CPU kernels, %d linear layers packed (oneDNN's "
                     "layout, or our bf16 kernel's)", twins, pack_linears(self.model))
        self.lora = (LoraManager(config, self.model, self.dtype, self.device)
                     if lora_enabled(config) else None)
        if self.device.type == "cpu" and isinstance(self.model, DecoderStack):
            # last: it chains the modules as they now are (twins, packed linears, no LoRA)
            self.model.decode_layers = cpu_decode.build(self.model)
            log.info("decode steps' layers in one compiled call: %s",
                     self.model.decode_layers is not None)

        use_graphs = self._wants_cuda_graphs(config)
        per_block = (2 * cfg.num_hidden_layers * config.block_size * cfg.num_key_value_heads
                     * cfg.head_dim * self.dtype.itemsize)
        if config.num_kv_blocks:
            self.num_blocks = config.num_kv_blocks
        elif self.device.type == "cuda":
            self.num_blocks = self._blocks_from_free_memory(per_block, wanted_len, use_graphs)
        else:
            self.num_blocks = max(1, config.kv_cache_bytes // per_block)
        # A sequence can never be longer than the whole cache.
        self.max_model_len = min(wanted_len, self.num_blocks * config.block_size)
        self.kv_caches = self._allocate_caches(self.num_blocks)
        log.info("model %s: %s on %s, %s attention, %d KV blocks of %d tokens, "
                 "max_model_len %d", model_dir, self.dtype, self.device, self.attention.name,
                 self.num_blocks, config.block_size, self.max_model_len)

        if self.device.type == "cpu":  # compile now, not inside a step (attention's kernel
            # was when its backend was chosen); the logits are fp32 in any model dtype
            cpu_argmax.available()
        self.graphs = None
        if use_graphs:
            from izh_trio.engine.cuda_graphs import DecodeGraphs

            with torch.inference_mode():
                self.graphs = DecodeGraphs(
                    lambda ids, pos, meta: self.model(ids, pos, meta, self.kv_caches),
                    max_batch=min(config.max_num_seqs, 512),
                    max_blocks_per_seq=-(-self.max_model_len // config.block_size),
                    max_context=self.max_model_len, num_kv_heads=cfg.num_key_value_heads,
                    device=self.device,
                )

    # ------------------------------------------------------------------ setup
    def _wants_cuda_graphs(self, config: EngineConfig) -> bool:
        possible = self.device.type == "cuda" and self.attention.name == "triton"
        if config.cuda_graphs == "on" and not possible:
            raise ValueError("cuda_graphs='on' needs a CUDA device and the triton attention "
                             f"backend (device {self.device}, backend {self.attention.name})")
        return possible and config.cuda_graphs != "off"

    def _allocate_caches(self, num_blocks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.model_config
        shape = (num_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        return [
            (torch.zeros(shape, dtype=self.dtype, device=self.device),
             torch.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(cfg.num_hidden_layers)
        ]

    @torch.inference_mode()
    def _profile_peak_bytes(self, wanted_len: int) -> int:
        """Peak activation memory of the largest step: a prefill chunk of the whole token budget
        (through a throwaway cache just big enough), then logits and a sampler-like softmax and
        sort for ``max_num_seqs`` rows."""
        config, bs = self.config, self.block_size
        n = max(1, min(config.max_num_batched_tokens, wanted_len))
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        blocks = -(-n // bs)
        caches = self._allocate_caches(blocks)
        step = StepAttention(slots=list(range(n)),
                             prefills=[ChunkSpec(0, n, n, list(range(blocks)))], decodes=[],
                             block_size=bs, window=self.model_config.sliding_window)
        meta = self.attention.build_metadata(step, self.device,
                                             self.model_config.num_key_value_heads)
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        hidden = self.model(ids, torch.arange(n, device=self.device), meta, caches)
        rows = hidden[-min(n, config.max_num_seqs):]
        logits = self.model.compute_logits(rows)
        logits.softmax(dim=-1)
        logits.sort(dim=-1, descending=True)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del caches, meta, hidden, rows, logits
        torch.cuda.empty_cache()
        return peak

    def _blocks_from_free_memory(self, per_block: int, wanted_len: int, use_graphs: bool
                                 ) -> int:
        peak = self._profile_peak_bytes(wanted_len)
        free, total = torch.cuda.mem_get_info(self.device)
        used = total - free  # weights, CUDA context, other processes
        reserve = CUDA_GRAPH_RESERVE_BYTES if use_graphs else 0
        budget = int(total * self.config.gpu_memory_utilization) - used - peak - reserve
        blocks = budget // per_block
        log.info("GPU memory: %.2f GiB total, %.2f GiB in use, activation peak %.2f GiB; "
                 "KV cache %.2f GiB (%d blocks) at gpu_memory_utilization %.2f",
                 total / 2**30, used / 2**30, peak / 2**30, max(0, blocks) * per_block / 2**30,
                 blocks, self.config.gpu_memory_utilization)
        if blocks < 1:
            raise RuntimeError(
                f"no GPU memory left for the KV cache: {used / 2**30:.2f} GiB in use and "
                f"{peak / 2**30:.2f} GiB of activations exceed gpu_memory_utilization="
                f"{self.config.gpu_memory_utilization} of {total / 2**30:.2f} GiB"
            )
        return blocks

    # ------------------------------------------------------------------ a step
    def _prepare(self, batch: list[ScheduledSeq]) -> _StepInputs:
        """Flatten the step into plain lists, in one pass: prefill chunks first, then decodes
        (one-token chunks), as attention wants them."""
        bs = self.block_size
        prefills = [item for item in batch if item.num_new_tokens > 1]
        decodes = [item for item in batch if item.num_new_tokens == 1]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        prefill_chunks: list[ChunkSpec] = []
        decode_chunks: list[ChunkSpec] = []
        sample_rows: list[int] = []
        sampling: list[ScheduledSeq] = []
        prompt_rows: list[tuple[Sequence, int, int]] = []
        lora_spans: list[tuple[int, int, int]] = []
        for item in prefills + decodes:
            seq, n = item.seq, item.num_new_tokens
            start, end, row = seq.num_computed_tokens, seq.num_computed_tokens + n, len(input_ids)
            table = seq.block_table  # the scheduler sized it to cover ``end`` tokens exactly
            if n == 1:  # a decode, most of every step: no slices, ranges or comprehensions
                decode_chunks.append(ChunkSpec(row, 1, end, table))
                input_ids.append(seq.token_ids[start])
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                prefill_chunks.append(ChunkSpec(row, n, end, table))
                input_ids += seq.token_ids[start:end]
                positions += range(start, end)
                slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            if item.samples:
                sample_rows.append(row + n - 1)
                sampling.append(item)
            if seq.params.prompt_logprobs is not None and not seq.num_output_tokens:
                # Rows predicting a prompt token: all of the chunk's but the last prompt row.
                scored = min(end, seq.num_prompt_tokens - 1) - start
                if scored > 0:
                    prompt_rows.append((seq, row, scored))
            if seq.lora_slot is not None:
                lora_spans.append((seq.lora_slot, row, n))
        return _StepInputs(
            input_ids=input_ids, positions=positions,
            attention=StepAttention(slots=slots, prefills=prefill_chunks, decodes=decode_chunks,
                                    block_size=bs, window=self.model_config.sliding_window),
            sample_rows=sample_rows, sampling=sampling,
            prompt_rows=prompt_rows, lora_spans=lora_spans,
        )

    def _forward(self, step: _StepInputs) -> torch.Tensor:
        att = step.attention
        adapters = self.lora is not None and self.lora.weights.begin_step(
            step.lora_spans, len(step.input_ids), self.device)
        if (self.graphs is not None and not adapters and not att.prefills
                and self.graphs.can_run(len(att.decodes))):
            return self.graphs.run(step.input_ids, step.positions, att.slots,
                                   [c.context_len for c in att.decodes],
                                   [c.block_table for c in att.decodes])
        meta = self.attention.build_metadata(att, self.device,
                                             self.model_config.num_key_value_heads)
        input_ids = long_tensor(step.input_ids, self.device)
        positions = long_tensor(step.positions, self.device)
        return self.model(input_ids, positions, meta, self.kv_caches)

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq]) -> StepLogits:
        """Run one step; fp32 logits for the rows that sample and the rows that score prompts."""
        step = self._prepare(batch)
        hidden = self._forward(step)
        if not step.prompt_rows and len(step.sample_rows) == len(step.input_ids):
            rows = hidden  # every row samples, in order (every decode step): no gather
        else:
            index = list(step.sample_rows)
            for _, first, count in step.prompt_rows:
                index += range(first, first + count)
            rows = hidden[long_tensor(index, self.device)]
        logits = self.model.compute_logits(rows)
        prompt, at = {}, len(step.sample_rows)
        for seq, _, count in step.prompt_rows:
            prompt[seq] = logits[at : at + count]
            at += count
        return StepLogits(logits[: len(step.sample_rows)], step.sampling, prompt)


@attrs.frozen
class StepLogits:
    sample: torch.Tensor  # [S, V]: one row per item of ``sampling``
    sampling: list[ScheduledSeq]
    #: Per sequence scoring its prompt: logits predicting the chunk's next prompt tokens.
    prompt: dict[Sequence, torch.Tensor]
