"""PEFT LoRA adapters for tests: made and saved by peft itself, with non-zero B."""

from __future__ import annotations

from pathlib import Path

import torch

ATTENTION_QV = ["q_proj", "v_proj"]
ALL_SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_peft_lora(out: Path, base_dir: Path, *, r: int, alpha: float, targets: list[str],
                   seed: int, **config: object) -> Path:
    """peft's ``save_pretrained`` of a LoRA on ``base_dir`` with random A and B."""
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    lora = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                           init_lora_weights=False, **config)
    peft.get_peft_model(model, lora).save_pretrained(out)
    return out


def merged_model(base_dir: Path, adapter_dir: Path | None):
    """The reference: the base model, with the adapter merged in by peft when one is given."""
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = peft.PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    return model.eval()


@torch.inference_mode()
def greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False)
    return out[0, len(prompt):].tolist()
