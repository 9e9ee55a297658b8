"""Triton kernels for the GPU path, each beside the torch reference it is tested against.

Importing this package imports triton; the engine imports it only for the triton backend.
"""

from izh_trio.kernels.decode_attention import (
    decode_attention,
    decode_attention_ref,
    default_num_splits,
)
from izh_trio.kernels.kv_store import store_kv, store_kv_ref
from izh_trio.kernels.prefill_attention import prefill_attention, prefill_attention_ref

__all__ = [
    "decode_attention",
    "decode_attention_ref",
    "default_num_splits",
    "prefill_attention",
    "prefill_attention_ref",
    "store_kv",
    "store_kv_ref",
]
