"""LoRA adapters per request: PEFT adapters read at start (or at runtime), held in slot
tensors, applied per token group inside a mixed batch. ``slots`` is plain Python."""
