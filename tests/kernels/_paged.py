"""Random paged caches for the kernel tests: scattered, shuffled blocks like a live engine's."""

from __future__ import annotations

import torch

TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}
#: The interpreter gets bf16 ``tl.dot`` wrong (numpy has no bf16): bf16 is checked on GPUs only.
DTYPES = ["float32", "float16"] + (["bfloat16"] if torch.cuda.is_available() else [])


def random_cache(num_blocks: int, block_size: int, h_kv: int, d: int, dtype: torch.dtype,
                 device: torch.device, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (num_blocks, block_size, h_kv, d)
    k = torch.randn(shape, generator=g).to(dtype=dtype, device=device)
    v = torch.randn(shape, generator=g).to(dtype=dtype, device=device)
    return k, v


def block_tables(context_lens: list[int], block_size: int, num_blocks: int, width: int,
                 index_dtype: torch.dtype, device: torch.device, g: torch.Generator
                 ) -> torch.Tensor:
    """Each sequence gets distinct blocks in a shuffled order; unused entries hold block 0."""
    perm = torch.randperm(num_blocks, generator=g).tolist()
    rows = []
    for ctx in context_lens:
        need = -(-ctx // block_size)
        rows.append(perm[:need] + [0] * (width - need))
        perm = perm[need:]
    assert all(len(r) == width for r in rows), "width too small for the contexts"
    return torch.tensor(rows, dtype=index_dtype, device=device)


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=TOL[dtype],
                               rtol=TOL[dtype])
