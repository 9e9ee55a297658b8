"""The choices both processes know: the frontend checks a setting against them, the
``EngineConfig`` on the wire again, and the engine acts on them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: ``auto``: the checkpoint's own dtype.
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: ``torch`` means no Triton (SDPA, or the compiled CPU kernel where it runs); ``auto`` is
#: Triton on CUDA and ``torch`` anywhere else.
ATTENTION_BACKENDS = ("auto", "torch", "triton")
#: Decode steps captured as CUDA graphs; ``auto``: on with CUDA and the Triton backend.
CUDA_GRAPHS_MODES = ("auto", "on", "off")


def check_lora_names(pairs: Iterable[Sequence[str]]) -> None:
    """Each LoRA adapter a non-empty name and a path, no name twice: ``ValueError`` if not."""
    pairs = tuple(pairs)
    names = [pair[0] for pair in pairs]
    if any(len(pair) != 2 or not pair[0] or not pair[1] for pair in pairs):
        raise ValueError(f"LoRA modules must be (name, path) pairs: {pairs}")
    if len(set(names)) != len(names):
        raise ValueError(f"LoRA module names must be unique: {names}")
