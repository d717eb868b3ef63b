"""The "pagedlab" attention: our paged KV cache plugged into a Hugging Face model.

transformers lets a model's attention be swapped by name (`AttentionInterface`). We register
"pagedlab": in every layer it receives the new tokens' Q, K, V (after RoPE), writes K and V into
their slots of the paged pool (`write_kv`), then attends each new query to its sequence's context
read through the block table (`paged_attention`; a sliding-window layer sees only the last W
positions). The per-step metadata (slot mappings, block tables, sequence lengths, query offsets)
rides along as one extra keyword argument of the model call, which transformers forwards untouched
to every attention call; `module.layer_idx` picks the layer's KV cache group (its block table and
slots) and its slot of the pool's pages (engine/runtime/kv_layout.py).

Called without our metadata (an ordinary `model(...)` or `model.generate(...)`), "pagedlab"
simply is SDPA, with the mask transformers builds for SDPA: the shared model stays a normal HF
model for everyone else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.runtime.kv_layout import KVLayout

ATTENTION_NAME = "pagedlab"
METADATA_KWARG = "pagedlab_metadata"


@dataclass
class PagedMetadata:
    """Everything the attention of every layer needs for one step (built once per step)."""

    kv_cache: torch.Tensor  # [page layers, 2, blocks, block_size, kv_heads, head_dim]
    ops: Any  # paged_kernels.KernelOps
    # per KV cache group (one for most models): int64 [total_tokens], where each new token's
    # K/V goes, and int32 [num_seqs, max_blocks] block tables (padding and dropped entries 0)
    slot_mappings: tuple[torch.Tensor, ...]
    block_tables: tuple[torch.Tensor, ...]
    seq_lens: torch.Tensor  # int32 [num_seqs]: context length including the new tokens
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]: sequence i owns rows [i] to [i + 1]
    max_query_len: int
    max_seq_len: int
    layout: KVLayout
    # a CUDA graph's attention grid: the step's (sequence, query tile) pairs, listed by the host
    # (engine/runtime/prefill_graphs.py); None: the grid follows the step
    tile_map: torch.Tensor | None = None
    # per layer, an event the pass waits on (on the device) before the layer reads its K/V: the
    # first layer of each part of a load from the CPU tier (engine/runtime/tier_copies.py)
    layer_waits: tuple[Any, ...] | None = None


def layer_cache(meta: PagedMetadata, layer: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Layer `layer`'s K and V caches `[blocks, block_size, kv_heads, head_dim]`, the slots its
    new tokens' K/V go to, and its KV cache group."""
    layout = meta.layout
    g = layout.layer_group[layer]
    layer_kv = meta.kv_cache[layout.layer_slot[layer]]
    return layer_kv[0], layer_kv[1], meta.slot_mappings[g], g


def attend(meta: PagedMetadata, group: int, q: torch.Tensor, k_cache: torch.Tensor,
           v_cache: torch.Tensor, scale: float) -> torch.Tensor:
    """Paged attention of the packed queries `[T, q_heads, D]` over their contexts, read through
    the block tables of KV cache group `group` (its window, if it slides)."""
    window = meta.layout.windows[group]
    extra = {} if window is None else {"window": window}  # the kernels' no-window path as is
    if meta.tile_map is not None:
        extra["tile_map"] = meta.tile_map
    return meta.ops.paged_attention(
        q, k_cache, v_cache, meta.block_tables[group], meta.seq_lens, meta.query_start_loc,
        scale, max_query_len=meta.max_query_len, max_seq_len=meta.max_seq_len, **extra)


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The "pagedlab" attention. query [1, q_heads, T, D], key/value [1, kv_heads, T, D]."""
    meta: PagedMetadata | None = kwargs.pop(METADATA_KWARG, None)
    if meta is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    if query.shape[0] != 1:
        raise ValueError("paged attention expects all tokens packed into one row (batch 1)")
    # [1, heads, T, D] -> [T, heads, D]: token-major, the kernels' packed layout.
    q = query[0].transpose(0, 1).contiguous()
    k = key[0].transpose(0, 1).contiguous()
    v = value[0].transpose(0, 1).contiguous()
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    k_cache, v_cache, slots, group = layer_cache(meta, module.layer_idx)
    # Write first: the new tokens attend to themselves, and the kernel reads them from the pool.
    meta.ops.write_kv(k, v, k_cache, v_cache, slots)
    out = attend(meta, group, q, k_cache, v_cache, scale)
    return out.unsqueeze(0), None  # [1, T, q_heads, D], as the model's o_proj expects


def register_paged_attention() -> None:
    """Make "pagedlab" a valid attn_implementation (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
    # The SDPA mask serves the plain calls (padding included). In a paged call it is built too
    # but ignored: our kernels derive causality and windows from seq_lens and query_start_loc.
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def use_paged_attention(model: Any) -> None:
    """Switch a loaded HF model to "pagedlab". Safe on a shared model: without our metadata the
    function is SDPA, so every other use of the model sees no difference."""
    register_paged_attention()
    if model.config._attn_implementation == ATTENTION_NAME:
        return
    try:
        model.set_attn_implementation(ATTENTION_NAME)  # also updates sub-models' configs
    except (AttributeError, ValueError):
        # Older or stricter transformers: every attention layer reads the shared config anyway.
        model.config._attn_implementation = ATTENTION_NAME
