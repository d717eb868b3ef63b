"""The lean decoder: a Llama-family forward pass for serving steps, from the model's own weights.

Run through Hugging Face's modules, one decoder layer is about forty kernel launches; in a decode
step of a small model those launches, not bytes, set the time, even inside a CUDA graph (each
launch still costs the GPU a few microseconds). This is the same computation in nine launches
per layer, in the order the modules do it:

    add_rms_norm -> qkv matmul -> rope_write_kv -> paged attention -> o_proj
    add_rms_norm -> gate_up matmul -> silu_and_mul -> down_proj

Two of those are one matmul where the modules have several: at load time `fuse_projections`
re-lays each layer's q/k/v weights into one tensor, and gate/up into another, and points the
modules' own parameters at row slices of them. The values do not change, no memory is added,
and the modules keep working for everyone else (prefill, HF `generate`).

Rounding follows the modules (see paged_kernels/layer_reference.py), and RoPE's cos/sin table is made
by the model's own rotary embedding, so the two paths agree to float32 precision and mostly to
the last bit in bf16. Architectures that are not laid out like Llama keep the module path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.runtime.attention_plugin import PagedMetadata, attend, layer_cache


@dataclass(frozen=True)
class LeanLayer:
    input_norm: torch.Tensor
    qkv_weight: torch.Tensor  # [(Hq + 2 Hkv) * D, hidden]: q, k, v projections stacked
    qkv_bias: torch.Tensor | None
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up_weight: torch.Tensor  # [2 * intermediate, hidden]: gate then up
    down_weight: torch.Tensor


@dataclass(frozen=True)
class LeanWeights:
    """The fused view of a Llama-family model's weights, built once per loaded model."""

    embed: torch.Tensor
    layers: tuple[LeanLayer, ...]
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    eps: float
    cos_sin: torch.Tensor  # [max_positions, 2 * head_dim]: cos | sin, in the model's dtype
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    # Tensor parallelism (engine/tp/shard.py): sums a row-parallel output over the ranks.
    reduce: Any = None
    # ... and, where it can (a CUDA graph's sums on symmetric memory: engine/tp/fused_norm.py),
    # sums it, adds the residual and normalises in one kernel: (normed, residual) or None
    reduce_norm: Any = None


def fuse_projections(model: Any) -> LeanWeights | None:
    """Re-lay q/k/v and gate/up into fused tensors (in place, values unchanged) and return the
    lean view of the weights; None when the model is not laid out like Llama."""
    base = getattr(model, "model", None)
    cfg = model.config
    try:
        layers = list(base.layers)
        attn0, mlp0 = layers[0].self_attn, layers[0].mlp
        _ = (attn0.q_proj, attn0.k_proj, attn0.v_proj, attn0.o_proj, mlp0.gate_proj,
             mlp0.up_proj, mlp0.down_proj, layers[0].input_layernorm.weight,
             layers[0].post_attention_layernorm.weight, base.norm.weight, base.embed_tokens,
             base.rotary_emb)
    except (AttributeError, IndexError, TypeError):
        return None
    if hasattr(attn0, "q_norm") or hasattr(attn0, "k_norm"):
        return None  # per-head q/k norms (Qwen3): a step the lean layer does not have
    if getattr(cfg, "hidden_act", None) != "silu" or getattr(mlp0.gate_proj, "bias", None) is not None:
        return None
    if type(layers[0].input_layernorm).__name__ not in ("LlamaRMSNorm", "MistralRMSNorm",
                                                         "Qwen2RMSNorm"):
        return None  # other norms (LayerNorm, Gemma's 1 + weight) compute something else
    eps = float(layers[0].input_layernorm.variance_epsilon)
    head_dim = int(attn0.head_dim)
    if head_dim & (head_dim - 1):
        return None  # the fused RoPE kernel loads whole power-of-two head rows
    lean = []
    with torch.no_grad():
        for layer in layers:
            a, m = layer.self_attn, layer.mlp
            qkv_w = _stack([a.q_proj, a.k_proj, a.v_proj], "weight")
            qkv_b = _stack([a.q_proj, a.k_proj, a.v_proj], "bias")
            gate_up = _stack([m.gate_proj, m.up_proj], "weight")
            lean.append(LeanLayer(layer.input_layernorm.weight, qkv_w, qkv_b, a.o_proj.weight,
                                  a.o_proj.bias, layer.post_attention_layernorm.weight, gate_up,
                                  m.down_proj.weight))
        cos_sin = _cos_sin_table(base, cfg, model.dtype, model.device)
    lm_head = model.get_output_embeddings().weight
    return LeanWeights(base.embed_tokens.weight, tuple(lean), base.norm.weight, lm_head, eps,
                       cos_sin, int(cfg.num_attention_heads),
                       int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
                       head_dim, float(attn0.scaling))


def _stack(modules: list[Any], name: str) -> torch.Tensor | None:
    """One tensor holding the modules' parameters `name` back to back; each module's parameter
    becomes a row slice of it (already done: the existing tensor is returned)."""
    params = [getattr(mod, name) for mod in modules]
    if all(p is None for p in params):
        return None
    if any(p is None for p in params):
        raise ValueError(f"some projections have a {name} and some do not")
    first = params[0]
    if all(p.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() for p in params):
        rows = sum(p.shape[0] for p in params)
        return first.as_strided((rows,) + tuple(first.shape[1:]), first.stride(),
                                first.storage_offset())
    fused = torch.cat([p.detach() for p in params], dim=0)
    start = 0
    for mod, p in zip(modules, params, strict=True):
        setattr(mod, name, torch.nn.Parameter(fused[start:start + p.shape[0]], requires_grad=False))
        start += p.shape[0]
    return fused


def _cos_sin_table(base: Any, cfg: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    positions = torch.arange(int(cfg.max_position_embeddings), device=device)[None]
    probe = torch.zeros(1, dtype=dtype, device=device)
    cos, sin = base.rotary_emb(probe, positions)
    return torch.cat([cos[0], sin[0]], dim=-1).to(dtype).contiguous()


def lean_forward(w: LeanWeights, meta: PagedMetadata, input_ids: torch.Tensor,
                 positions: torch.Tensor, last_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Logits of the tokens in `last_rows` (default: every token, as in a decode step, where
    each is its sequence's last), `[rows, vocab]`. Tokens are packed sequence after sequence
    (`meta.query_start_loc`); each new token's K/V is written into its slot of its layer's KV
    cache group (`meta`: engine/runtime/attention_plugin.py). No host reads: safe to capture in
    a CUDA graph."""
    F = torch.nn.functional
    ops = meta.ops
    hq, hkv = w.num_q_heads, w.num_kv_heads
    h = F.embedding(input_ids, w.embed)
    residual = None
    for i, layer in enumerate(w.layers):
        # under tensor parallelism h is this rank's part of the last down_proj: summed here
        x, residual = _sum_add_norm(w, ops, h, residual, layer.input_norm, partial=i > 0)
        qkv = F.linear(x, layer.qkv_weight, layer.qkv_bias)
        k_cache, v_cache, slots, group = layer_cache(meta, i)
        if meta.layer_waits is not None and meta.layer_waits[i] is not None:
            torch.cuda.current_stream().wait_event(meta.layer_waits[i])  # captured: a wait node
        q = ops.rope_write_kv(qkv, w.cos_sin, positions, k_cache, v_cache, slots, hq, hkv)
        attn = attend(meta, group, q, k_cache, v_cache, w.scale)
        h = F.linear(attn.flatten(1), layer.o_weight, layer.o_bias)
        x, residual = _sum_add_norm(w, ops, h, residual, layer.post_norm, partial=True)
        h = F.linear(ops.silu_and_mul(F.linear(x, layer.gate_up_weight)), layer.down_weight)
    if last_rows is not None:  # the LM head only where a next token is wanted (and its sum)
        h, residual = h[last_rows], residual[last_rows]
    x, _ = _sum_add_norm(w, ops, h, residual, w.final_norm, partial=bool(w.layers))
    return F.linear(x, w.lm_head)


def _sum_add_norm(w: LeanWeights, ops: Any, h: torch.Tensor, residual: torch.Tensor | None,
                  weight: torch.Tensor, partial: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """add_rms_norm(h, residual); where h is a rank's partial sum (tensor parallelism), of h
    summed over the ranks: in one fused kernel where the reducer has one for it, else an
    all-reduce and then the norm. Rows are summed independently, so a slice's sum is the sum's
    slice."""
    if partial and w.reduce is not None:
        if w.reduce_norm is not None and residual is not None:
            fused = w.reduce_norm(h, residual, weight, w.eps)
            if fused is not None:
                return fused
        h = w.reduce(h)
    return ops.add_rms_norm(h, residual, weight, w.eps)
