"""Kernels of PagedLab: paged attention and KV-cache operations, Triton or plain torch.

Owns the dispatch: `get_kernel_ops(device, backend)` returns a `KernelOps` whose functions all
share the signatures documented in `paged_kernels.reference`:

    ops = get_kernel_ops(torch.device("cuda"))
    ops.write_kv(key, value, k_cache, v_cache, slot_mapping)
    out = ops.paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)
    ops.copy_blocks(kv_cache, src_block_ids, dst_block_ids)
    ops.swap_blocks(src_cache, dst_cache, src_block_ids, dst_block_ids)
    normed, residual = ops.add_rms_norm(x, residual, weight, eps)    # the lean decoder's
    q = ops.rope_write_kv(qkv, cos_sin, positions, k_cache, v_cache, slots, hq, hkv)  # fused
    act = ops.silu_and_mul(gate_up)                                  # layer ops

Triton is imported only when a Triton backend is requested, so `import paged_kernels` works on
machines without triton (macOS, Windows) and the CPU path never pays for it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["KernelOps", "get_kernel_ops", "triton_available", "interpreter_enabled"]


@dataclass(frozen=True)
class KernelOps:
    """The kernel functions of one backend ("triton" or "reference")."""

    name: str
    paged_attention: Callable[..., torch.Tensor]
    write_kv: Callable[..., None]
    copy_blocks: Callable[..., None]
    swap_blocks: Callable[..., None]
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rope_write_kv: Callable[..., torch.Tensor]
    silu_and_mul: Callable[..., torch.Tensor]


def triton_available() -> bool:
    """Whether the triton package is installed (does not import it)."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """Whether Triton kernels run on CPU through Triton's interpreter (`TRITON_INTERPRET=1`).

    Triton reads the variable when a kernel is defined, i.e. when `paged_kernels.paged_attention` or
    `paged_kernels.cache_ops` is first imported: set it before that.
    """
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _reference_ops() -> KernelOps:
    # Attention is the vectorised torch version: the loop in reference.py is the tests' oracle,
    # too slow for serving-sized batches (one Python iteration per sequence per layer).
    from . import layer_reference, reference, torch_attention

    return KernelOps("reference", torch_attention.paged_attention, reference.write_kv,
                     reference.copy_blocks, reference.swap_blocks,
                     layer_reference.add_rms_norm, layer_reference.rope_write_kv,
                     layer_reference.silu_and_mul)


def _triton_ops() -> KernelOps:
    from . import cache_ops, layer_ops, paged_attention

    return KernelOps("triton", paged_attention.paged_attention, cache_ops.write_kv,
                     cache_ops.copy_blocks, cache_ops.swap_blocks,
                     layer_ops.add_rms_norm, layer_ops.rope_write_kv, layer_ops.silu_and_mul)


def get_kernel_ops(device: torch.device | str, backend: str = "auto") -> KernelOps:
    """Kernels for tensors on `device`.

    backend "auto": Triton on CUDA (when triton is installed), the torch references elsewhere.
    "triton" forces Triton (on CPU only valid under TRITON_INTERPRET=1, i.e. for tests);
    "reference" forces the plain-torch versions (attention: the vectorised one of
    `paged_kernels.torch_attention`, which the tests hold equal to the loop of `paged_kernels.reference`).
    """
    device = torch.device(device)
    if backend == "reference":
        return _reference_ops()
    if backend == "auto":
        if device.type == "cuda" and triton_available():
            return _triton_ops()
        return _reference_ops()
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("backend='triton' but the triton package is not installed")
        if device.type != "cuda" and not interpreter_enabled():
            raise ValueError(
                f"backend='triton' on {device.type} needs TRITON_INTERPRET=1 (set before the "
                "kernels are imported); use backend='reference' or 'auto' instead"
            )
        return _triton_ops()
    raise ValueError(f"unknown kernel backend {backend!r}: use 'auto', 'triton' or 'reference'")
