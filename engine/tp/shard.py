"""Megatron-style sharding of a loaded Llama-family model, in place, for one tensor-parallel rank.

Rank r of N keeps heads r*H/N .. (r+1)*H/N - 1 of every attention layer and the same slice of
the MLP's intermediate features:

    q_proj, k_proj, v_proj, gate_proj, up_proj   split by output rows    (column parallel)
    o_proj, down_proj                            split by input columns  (row parallel)

A column-parallel layer needs no communication (each rank computes its own heads); a
row-parallel one leaves each rank with a partial sum of the full hidden state, so one all-reduce
follows o_proj and one follows down_proj: two per layer. Embeddings, norms and the LM head stay
whole on every rank.

After sharding, the model is an ordinary (smaller) HF model with H/N query heads and KV/N KV
heads: the same ModelRunner, CacheEngine, lean decoder and attention kernels run it unchanged;
only the all-reduce is added (a hook on o_proj / down_proj for the module path, `reduce` in the
lean weights for the lean path).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from engine.runtime.lean_decoder import fuse_projections


def valid_sizes(num_kv_heads: int) -> list[int]:
    """Every tensor-parallel size that splits `num_kv_heads` KV heads evenly."""
    return [n for n in range(1, num_kv_heads + 1) if num_kv_heads % n == 0]


def check_tp_size(size: int, num_q_heads: int, num_kv_heads: int, model: str) -> None:
    """A clear error unless `size` divides the KV heads (and so, with GQA, the query heads)."""
    if num_kv_heads % size or num_q_heads % size:
        sizes = ", ".join(map(str, valid_sizes(num_kv_heads)))
        raise ValueError(
            f"tensor_parallel_size={size} does not divide model {model!r}'s {num_kv_heads} KV "
            f"heads: each rank must hold whole KV heads. Valid sizes: {sizes}")


def shard_model(loaded: Any, rank: int, size: int, reduce: Callable[[torch.Tensor], torch.Tensor],
                reduce_norm: Callable[..., Any] | None = None) -> None:
    """Cut `loaded` (an engine.runtime.models.LoadedModel) down to rank `rank`'s shard, in place.

    `reduce` sums a tensor over the ranks (an all-reduce) and returns it; it runs after every
    o_proj and down_proj. `reduce_norm` (optional: the lean decoder's) does the sum together
    with the residual add and RMSNorm after it, or returns None where it cannot."""
    model, cfg = loaded.model, loaded.config
    hq, hkv, d = loaded.num_q_heads, loaded.num_kv_heads, loaded.head_dim
    check_tp_size(size, hq, hkv, loaded.name)
    inter = int(cfg.intermediate_size)
    if inter % size:
        raise ValueError(f"tensor_parallel_size={size} does not divide the MLP's {inter} "
                         f"intermediate features")
    with torch.no_grad():
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            _rows(a.q_proj, rank, size, hq * d)
            _rows(a.k_proj, rank, size, hkv * d)
            _rows(a.v_proj, rank, size, hkv * d)
            _cols(a.o_proj, rank, size)
            _rows(m.gate_proj, rank, size, inter)
            _rows(m.up_proj, rank, size, inter)
            _cols(m.down_proj, rank, size)
            for mod in (a.o_proj, m.down_proj):
                mod.register_forward_hook(lambda _m, _i, out: reduce(out))
    # The config now describes the shard: the pool and the kernels read heads from it. head_dim
    # is pinned first, as hidden_size // heads would change with the head count.
    cfg.head_dim = d
    cfg.num_attention_heads = hq // size
    cfg.num_key_value_heads = hkv // size
    cfg.intermediate_size = inter // size
    lean = fuse_projections(model)  # the shard's q/k/v and gate/up, fused again
    loaded.lean = None if lean is None else replace(lean, reduce=reduce, reduce_norm=reduce_norm)


def _rows(linear: torch.nn.Linear, rank: int, size: int, total: int) -> None:
    """Keep this rank's block of output rows (column parallel)."""
    per = total // size
    linear.weight = torch.nn.Parameter(linear.weight[rank * per:(rank + 1) * per].clone(),
                                       requires_grad=False)
    if linear.bias is not None:
        linear.bias = torch.nn.Parameter(linear.bias[rank * per:(rank + 1) * per].clone(),
                                         requires_grad=False)
    linear.out_features = per


def _cols(linear: torch.nn.Linear, rank: int, size: int) -> None:
    """Keep this rank's block of input columns (row parallel). A bias is added once, after the
    sum, so only rank 0 keeps it."""
    per = linear.in_features // size
    linear.weight = torch.nn.Parameter(
        linear.weight[:, rank * per:(rank + 1) * per].contiguous(), requires_grad=False)
    if linear.bias is not None and rank != 0:
        linear.bias = torch.nn.Parameter(torch.zeros_like(linear.bias), requires_grad=False)
    linear.in_features = per
