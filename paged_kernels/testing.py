"""Paged inputs for checking an attention kernel: the case generator that the kernel tests and
the GPU sweep (bench/gpu_kernel_check.py) both build their batches from, and the error measure
they judge by. Kept in the product package so that bench/ never imports tests/.
"""

from __future__ import annotations

import torch

__all__ = ["default_device", "make_case", "rel_error"]


def default_device() -> torch.device:
    """CUDA where there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_case(
    block_size: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    q_lens: list[int],
    seq_lens: list[int],
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
    shuffle: bool = True,
    seed: int = 0,
) -> dict:
    """Random q and a paged cache. Blocks are handed out by a random permutation (shuffle) or in
    order; every slot no sequence owns and every block-table padding entry point at NaNs, so a
    kernel that reads beyond a sequence's length poisons its output. The device defaults to
    CUDA where there is one."""
    device = device if device is not None else default_device()
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(pages) + 2  # spare blocks: never referenced, full of NaN
    order = torch.randperm(num_blocks, generator=gen) if shuffle else torch.arange(num_blocks)
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    poison = int(order[-1])  # a spare block: padding entries of the tables point here
    tables = torch.full((len(seq_lens), max(pages) + 1), poison, dtype=torch.int32)
    next_block = 0
    for i, (n, seq_len) in enumerate(zip(pages, seq_lens, strict=True)):
        ids = order[next_block:next_block + n]
        next_block += n
        tables[i, :n] = ids
        slots = (ids[:, None] * block_size + torch.arange(block_size)).flatten()[:seq_len]
        k_cache.view(-1, num_kv_heads, head_dim)[slots] = torch.randn(
            seq_len, num_kv_heads, head_dim, generator=gen)
        v_cache.view(-1, num_kv_heads, head_dim)[slots] = torch.randn(
            seq_len, num_kv_heads, head_dim, generator=gen)
    q = torch.randn(sum(q_lens), num_kv_heads * group, head_dim, generator=gen)
    qsl = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return dict(
        q=q.to(device, dtype), k_cache=k_cache.to(device, dtype), v_cache=v_cache.to(device, dtype),
        block_tables=tables.to(device), seq_lens=torch.tensor(seq_lens, dtype=torch.int32,
                                                              device=device),
        query_start_loc=qsl.to(device), scale=head_dim ** -0.5,
    )


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """The relative error ||x - ref|| / ||ref|| in float64 on the host."""
    x, ref = x.double().cpu(), ref.double().cpu()
    return float((x - ref).norm() / ref.norm())
