"""Launch heuristics of the Triton paged attention (`paged_kernels.paged_attention`): tile sizes and
the split-K count.

Kept apart from the kernels so that each file fits its job; `paged_kernels.paged_attention` imports
`AttnConfig`, `select_config` and `choose_num_splits` back under the same names. The benchmarks'
`CONFIG_OVERRIDE` stays in `paged_kernels.paged_attention` (they assign `pa.CONFIG_OVERRIDE = ...`),
which hands it to `select_config` at every launch.

This module imports torch and triton (for `triton.next_power_of_2` / `triton.cdiv`), no kernels.
"""

from __future__ import annotations

import numpy as np
import torch
import triton

__all__ = ["AttnConfig", "select_config", "choose_num_splits", "query_tile", "tile_map"]


class AttnConfig:
    """Tile sizes and launch options of one `_paged_attn_kernel` launch."""

    def __init__(self, block_m: int, block_n: int, num_warps: int, num_stages: int):
        self.block_m, self.block_n = block_m, block_n
        self.num_warps, self.num_stages = num_warps, num_stages

    def __repr__(self) -> str:
        return (f"AttnConfig(block_m={self.block_m}, block_n={self.block_n}, "
                f"num_warps={self.num_warps}, num_stages={self.num_stages})")


def select_config(max_query_len: int, group: int, head_dim: int, block_size: int,
                  override: dict | None = None) -> AttnConfig:
    """A simple heuristic in place of autotuning (autotune does not run under the interpreter
    and costs seconds of benchmarking at the first call of every shape).

    Decode (all q_len == 1) is memory bound: the M tile is just the query heads of one group
    (padded to 16 for tl.dot) and K/V tiles are large (whole pages when block_size >= 16) so
    each iteration has many bytes in flight. Prefill is compute bound: a 64-row M tile.
    `override` (decode only: any of block_n / num_warps / num_stages) lets benchmarks sweep
    configurations without editing the heuristic.
    """
    group_p2 = max(16, triton.next_power_of_2(group))
    if max_query_len == 1:
        block_m = group_p2
        block_n = max(64, min(block_size, 128)) if head_dim <= 64 else 64
        # num_stages=2: the H100 sweep (bench/NOTES.md) ran B=256, L=2048 in 160 us against
        # 199 us with 3 stages, and B=32 no slower.
        cfg = AttnConfig(block_m, block_n, num_warps=4, num_stages=2)
        if override:
            for key, value in override.items():
                setattr(cfg, key, value)
        return cfg
    # Small chunks (speculative or forced multi-token appends) do not need a 64-row tile.
    block_m = min(max(group_p2, triton.next_power_of_2(group * max_query_len)), max(64, group_p2))
    block_n = 64 if head_dim <= 64 else 32
    return AttnConfig(block_m, block_n, num_warps=4, num_stages=2)


def query_tile(max_query_len: int, group: int, head_dim: int, block_size: int) -> int:
    """Query tokens a program of the kernel takes at this `max_query_len`: a tile map's unit."""
    return select_config(max_query_len, group, head_dim, block_size).block_m // group


def tile_map(q_lens: np.ndarray, tile: int, size: int) -> np.ndarray:
    """The (sequence, query tile) pairs of a step whose sequences have these query lengths, at
    `tile` tokens a tile, as int32 [2, size]: the sequences, then their tiles, in order; the
    entries past the step's pairs are (-1, 0), which the kernel skips."""
    q_lens = np.asarray(q_lens, dtype=np.int64)
    counts = -(-q_lens // tile)
    total = int(counts.sum())
    if total > size:
        raise ValueError(f"the step has {total} query tiles, the map holds {size}")
    out = np.zeros((2, size), dtype=np.int32)
    out[0, total:] = -1
    out[0, :total] = np.repeat(np.arange(len(q_lens)), counts)
    firsts = np.repeat(np.cumsum(counts) - counts, counts)
    out[1, :total] = np.arange(total) - firsts
    return out


_SM_COUNT: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_n: int,
                      device: torch.device, window: int | None = None) -> int:
    """Split-K only when the plain grid cannot keep the GPU busy: under ~2 programs per SM. With
    a sliding window a decode reads at most `window` keys, so that is the length split. A chunk
    of a few tokens is one query tile a sequence, like a decode: the 4 tokens after a 4,096-token
    prefix loaded from the CPU tier are 8 programs of a Llama-3.2-1B shape, each reading all
    4,096 keys alone (107 µs a layer on an H100, `mem_h100_run3_profiles.txt`) unless split.

    Two per SM, not four: on an H100 (132 SMs) a 1.2B decode of 64 sequences has 512 programs,
    and unsplit it took 32.6 µs a layer in a CUDA graph against 35.9 µs split in two plus the
    merge (bench/results/mem_h100_kernel_probe_graph.json).

    Fewer programs than SMs (a few sequences): split to about 8 programs per SM, in slices of at
    least 128 keys, at most 64 and a power of two. On an H200 (bench/results/split_probe_h200.json,
    8 KV heads, inside CUDA graphs) that was the fastest count, or within 2% of it, for 1-16
    sequences over 4,100 keys and one over 16,384, where the rule for bigger grids (2 per SM,
    slices of 256 keys) left 5-27% on the table (16 sequences over 4,100 keys: 41.6 µs against
    56.0); over 1,024 keys it takes 8 slices (6.2 µs against the old 8.2; 16 slices of 64 keys
    took 5.4)."""
    programs = num_seqs * num_kv_heads
    sms = _num_sms(device)
    if device.type != "cuda" or programs >= 2 * sms:
        return 1
    keys = min(max_seq_len, window) if window else max_seq_len
    if programs < sms:
        few = min(triton.cdiv(8 * sms, programs), keys // max(128, block_n), 64)
        return 1 << (few.bit_length() - 1) if few > 1 else 1
    by_length = keys // max(256, block_n)
    return max(1, min(triton.cdiv(2 * sms, programs), by_length, 32))
