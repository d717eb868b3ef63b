"""Plain-torch references of the fused layer operations of the lean decoder (`layer_ops.py`).

Each one rounds exactly where Hugging Face's Llama modules round (in the model's dtype after
every elementwise op), so the fused path and the module path agree to the last bit on most
inputs; the Triton twins in `layer_ops.py` follow the same order.
"""

from __future__ import annotations

import torch

__all__ = ["add_rms_norm", "rope_write_kv", "silu_and_mul"]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual); `residual=None` means no add.

    As `LlamaRMSNorm` after the decoder layer's residual add: the sum is rounded to the model's
    dtype, normalised in float32, rounded again, then scaled by the weight.
    """
    summed = x if residual is None else x + residual
    h = summed.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype), summed


def rope_write_kv(qkv: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                  num_q_heads: int, num_kv_heads: int) -> torch.Tensor:
    """Rotate q and k of a fused QKV projection `[T, (Hq + 2 Hkv) * D]` by their positions
    (`cos_sin[pos] = [cos | sin]`, each D wide, as the model's rotary embedding made them), write
    rotated k and v into their cache slots (-1: none) and return q `[T, Hq, D]`.
    """
    d = k_cache.shape[-1]
    t = qkv.shape[0]
    q = qkv[:, : num_q_heads * d].view(t, num_q_heads, d)
    k = qkv[:, num_q_heads * d: (num_q_heads + num_kv_heads) * d].view(t, num_kv_heads, d)
    v = qkv[:, (num_q_heads + num_kv_heads) * d:].view(t, num_kv_heads, d)
    cs = cos_sin[positions]
    cos, sin = cs[:, None, :d], cs[:, None, d:]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        half = torch.cat((-x[..., d // 2:], x[..., : d // 2]), dim=-1)
        return (x * cos) + (half * sin)

    q, k = rotate(q), rotate(k)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    bs = k_cache.shape[1]
    k_cache[slots // bs, slots % bs] = k[keep].to(k_cache.dtype)
    v_cache[slots // bs, slots % bs] = v[keep].to(v_cache.dtype)
    return q.contiguous()


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for a fused `[T, 2 I]` gate/up projection, as `LlamaMLP` rounds it."""
    i = gate_up.shape[-1] // 2
    return torch.nn.functional.silu(gate_up[:, :i]) * gate_up[:, i:]
