"""Owns the model and the KV cache; turns a step plan into tensors and logits."""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
import torch

from izh_trio.engine.attention import AttentionMetadata, PrefillChunk
from izh_trio.engine.loader import Qwen3Config, iter_safetensors, resolve_dtype
from izh_trio.engine.models.qwen3 import Qwen3ForCausalLM
from izh_trio.engine.scheduler import ScheduledSeq
from izh_trio.engine.sequence import Sequence
from izh_trio.wire import EngineConfig

log = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        model_dir = Path(config.model_dir)
        self.model_config = cfg = Qwen3Config.from_dir(model_dir)
        self.device = torch.device(config.device)
        self.dtype = resolve_dtype(config.dtype, cfg.dtype)
        self.block_size = config.block_size
        wanted_len = config.max_model_len or cfg.max_position_embeddings

        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with self.device:
                self.model = Qwen3ForCausalLM(cfg, max_positions=wanted_len)
        finally:
            torch.set_default_dtype(previous)
        self.model.load_weights(iter_safetensors(model_dir))
        self.model.eval()

        per_block = (2 * cfg.num_hidden_layers * config.block_size * cfg.num_key_value_heads
                     * cfg.head_dim * self.dtype.itemsize)
        self.num_blocks = config.num_kv_blocks or max(1, config.kv_cache_bytes // per_block)
        # A sequence can never be longer than the whole cache.
        self.max_model_len = min(wanted_len, self.num_blocks * config.block_size)
        shape = (self.num_blocks, config.block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=self.dtype, device=self.device),
             torch.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(cfg.num_hidden_layers)
        ]
        log.info("model %s: %s on %s, %d KV blocks of %d tokens, max_model_len %d", model_dir,
                 self.dtype, self.device, self.num_blocks, config.block_size, self.max_model_len)

    def _prepare(self, batch: list[ScheduledSeq]) -> tuple[
        torch.Tensor, torch.Tensor, AttentionMetadata, list[int], list[ScheduledSeq],
        list[tuple[Sequence, int, int]],
    ]:
        bs = self.block_size
        prefills = [item for item in batch if item.num_new_tokens > 1]
        decodes = [item for item in batch if item.num_new_tokens == 1]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        chunks: list[PrefillChunk] = []
        sample_rows: list[int] = []
        # (seq, first row, rows) whose logits score the prompt's own next tokens
        prompt_rows: list[tuple[Sequence, int, int]] = []
        for item in prefills + decodes:
            seq, start, n = item.seq, item.seq.num_computed_tokens, item.num_new_tokens
            table = seq.block_table
            if n > 1:
                chunks.append(PrefillChunk(
                    query_start=len(input_ids), query_len=n, context_len=start + n,
                    block_table=torch.tensor(table[: -(-(start + n) // bs)], dtype=torch.long),
                ))
            wants_prompt = (seq.params.prompt_logprobs is not None and seq.num_emitted == 0
                            and start < seq.num_prompt_tokens - 1)
            if wants_prompt:
                prompt_rows.append((seq, len(input_ids),
                                    min(start + n, seq.num_prompt_tokens - 1) - start))
            input_ids += seq.token_ids[start : start + n]
            span = range(start, start + n)
            positions += span
            slots += [table[p // bs] * bs + p % bs for p in span]
            if item.samples:
                sample_rows.append(len(input_ids) - 1)
        decode_tables = decode_mask = None
        if decodes:
            width = max(len(item.seq.block_table) for item in decodes)
            tables = [item.seq.block_table + [0] * (width - len(item.seq.block_table))
                      for item in decodes]
            decode_tables = torch.tensor(tables, dtype=torch.long)
            ctx = torch.tensor([item.seq.num_computed_tokens + 1 for item in decodes])
            decode_mask = (torch.arange(width * bs)[None, :] < ctx[:, None])[:, None, None, :]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long),
            prefills=tuple(chunks),
            num_prefill_tokens=sum(item.num_new_tokens for item in prefills),
            decode_block_tables=decode_tables,
            decode_mask=decode_mask,
        )
        order = prefills + decodes
        return (torch.tensor(input_ids, dtype=torch.long), torch.tensor(positions), meta,
                sample_rows, [i for i in order if i.samples], prompt_rows)

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq]) -> StepLogits:
        """Run one step; fp32 logits for the rows that sample and the rows that score prompts."""
        input_ids, positions, meta, sample_rows, sampling, prompt_rows = self._prepare(batch)
        hidden = self.model(input_ids, positions, meta, self.kv_caches)
        rows = list(sample_rows)
        for _, first, count in prompt_rows:
            rows += range(first, first + count)
        logits = self.model.compute_logits(hidden[torch.tensor(rows, dtype=torch.long)])
        prompt, at = {}, len(sample_rows)
        for seq, _, count in prompt_rows:
            prompt[seq] = logits[at : at + count]
            at += count
        return StepLogits(logits[: len(sample_rows)], sampling, prompt)


@attrs.frozen
class StepLogits:
    sample: torch.Tensor  # [S, V]: one row per item of ``sampling``
    sampling: list[ScheduledSeq]
    #: Per sequence scoring its prompt: logits predicting the chunk's next prompt tokens.
    prompt: dict[Sequence, torch.Tensor]
