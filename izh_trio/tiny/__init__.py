"""A tiny random-weight Qwen3 checkpoint, built offline, for tests and local runs (no torch)."""

from izh_trio.tiny.checkpoint import default_tiny_dir, make_tiny_checkpoint
from izh_trio.tiny.spec import SHAPES, TinySpec

__all__ = ["SHAPES", "TinySpec", "default_tiny_dir", "make_tiny_checkpoint"]
