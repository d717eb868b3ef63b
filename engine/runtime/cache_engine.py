"""The real KV tensors: the paged pool on the device, the CPU swap space, copies and swaps.

The bookkeeping (`block_pool`, `kv_cache_manager`) decides *which* block ids to use; this file
owns the bytes behind those ids. The whole pool is ONE tensor

    kv_cache[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]

so that a copy-on-write of any number of blocks is one launch over every layer, and a swap moves
whole blocks (all layers, K and V) in one transfer. `kv_cache[l, 0]` / `kv_cache[l, 1]` are layer
l's K and V caches, each contiguous `[num_blocks, block_size, num_kv_heads, head_dim]`: the
layout the attention kernels read. A model with several KV cache groups (full and sliding-window
layers) has pages of one group's layers instead: the first dimension is the largest group's
layer count and layer l lives at `kv_cache[layout.layer_slot[l]]` (engine/runtime/kv_layout.py).

Sizing with `num_gpu_blocks=None` follows vLLM: on a GPU, run a profiling forward pass, then give
the KV pool `memory_utilization` of the GPU minus everything already in use (weights, CUDA
context, other processes) and the activations' peak; on a CPU, use a fixed byte budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.core.kv_groups import KVCacheGroup
from engine.describe.units import gib, kib, mib
from engine.runtime.kv_layout import KVLayout
from engine.runtime.tier_copies import TierCopies

DEFAULT_CPU_POOL_BYTES = 512 * 1024**2  # a CPU has no "free GPU memory" to size from
DEFAULT_MEMORY_UTILIZATION = 0.9
DEFAULT_PROFILE_TOKENS = 2048  # the most tokens one step will run (max_num_batched_tokens)


@dataclass(frozen=True)
class KVShape:
    """What the KV pool needs to know about a model: its attention geometry."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    groups: tuple[KVCacheGroup, ...] = ()  # KV cache groups (); () = one group of every layer

    @classmethod
    def of(cls, model_or_shape: Any) -> KVShape:
        if isinstance(model_or_shape, KVShape):
            return model_or_shape
        return cls(int(model_or_shape.num_layers), int(model_or_shape.num_kv_heads),
                   int(model_or_shape.head_dim), tuple(getattr(model_or_shape, "kv_cache_groups", ())))

    @property
    def layout(self) -> KVLayout:
        if not self.groups:
            return KVLayout.single(self.num_layers)
        return KVLayout(self.groups, self.num_layers)


class CacheEngine:
    """The KV pool of `num_gpu_blocks` blocks (on `device`) and `num_cpu_blocks` swap blocks."""

    def __init__(
        self,
        model_or_shape: Any,
        num_gpu_blocks: int | None,
        block_size: int,
        num_cpu_blocks: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        num_offload_blocks: int = 0,
        memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
        cpu_pool_bytes: int = DEFAULT_CPU_POOL_BYTES,
        profile_tokens: int = DEFAULT_PROFILE_TOKENS,
        kernel_backend: str = "auto",
    ) -> None:
        from paged_kernels import get_kernel_ops

        self.shape = KVShape.of(model_or_shape)
        self.layout = self.shape.layout
        if device is None:
            device = getattr(model_or_shape, "device", "cpu")
        if dtype is None:
            dtype = getattr(model_or_shape, "dtype", torch.float32)
        self.device = torch.device(device)
        self.dtype = dtype
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive whole number, got {block_size!r}")
        if not 0.0 < memory_utilization <= 1.0:
            raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization}")
        self.block_size = block_size
        self.ops = get_kernel_ops(self.device, kernel_backend)

        if num_gpu_blocks is None:
            num_gpu_blocks, self.sizing_note = self._size_pool(
                model_or_shape, memory_utilization, cpu_pool_bytes, profile_tokens)
        else:
            self.sizing_note = f"{num_gpu_blocks} blocks, as configured"
        if num_gpu_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_gpu_blocks}")
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks

        # Zeros, not empty: the block inspector shows never-written slots, and garbage there
        # would look like data.
        self.kv_cache = torch.zeros(self._pool_shape(num_gpu_blocks), dtype=dtype,
                                    device=self.device)
        # the swap space: made at the first swap (`cpu_cache`), since most engines never swap
        self._cpu_cache: torch.Tensor | None = None
        # the prefix cache's CPU tier: evicted cached blocks, copied back on a prefix hit; each
        # slot one contiguous run of pinned bytes, copied by the DMA engines (tier_copies.py)
        self.num_offload_blocks = num_offload_blocks
        self.tier = TierCopies(self.kv_cache, num_offload_blocks)

    def close(self) -> None:
        """Free the pool and the swap space now (idempotent): the tensors go as soon as nothing
        else holds them, with no garbage collection needed. The sizes stay readable."""
        self.kv_cache = self._cpu_cache = self.tier = None

    @property
    def cpu_cache(self) -> torch.Tensor:
        """The CPU swap space, allocated when first asked for (a browser session that never
        preempts by swap holds none of it). Pinned on a GPU machine: swaps then run at full
        PCIe speed, asynchronously."""
        if self._cpu_cache is None:
            if self.kv_cache is None:
                raise RuntimeError("this engine was closed: its KV pool is freed")
            self._cpu_cache = torch.zeros(self._pool_shape(self.num_cpu_blocks), dtype=self.dtype,
                                          pin_memory=self.device.type == "cuda")
        return self._cpu_cache

    @property
    def closed(self) -> bool:
        return self.kv_cache is None

    # ---- sizes ---------------------------------------------------------------------------------

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across all layers."""
        return self._bytes_per_slot(self.shape.num_layers)

    @property
    def bytes_per_block(self) -> int:
        """One block of the pool: a page of one group's layers (all layers, for one group)."""
        return self._bytes_per_slot(self.layout.page_layers) * self.block_size

    def _bytes_per_slot(self, layers: int) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * layers * self.shape.num_kv_heads * self.shape.head_dim * element

    @property
    def num_layers(self) -> int:
        return self.shape.num_layers

    def _pool_shape(self, num_blocks: int) -> tuple[int, ...]:
        s = self.shape
        return (self.layout.page_layers, 2, num_blocks, self.block_size, s.num_kv_heads, s.head_dim)

    def k_cache(self, layer: int) -> torch.Tensor:
        return self.kv_cache[self.layout.layer_slot[layer], 0]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self.kv_cache[self.layout.layer_slot[layer], 1]

    def _size_pool(self, model: Any, utilization: float, cpu_pool_bytes: int,
                   profile_tokens: int) -> tuple[int, str]:
        per_block = self.bytes_per_block
        if self.device.type != "cuda":
            blocks = max(1, cpu_pool_bytes // per_block)
            return blocks, (f"{blocks} blocks = CPU budget {mib(cpu_pool_bytes)} / "
                            f"{kib(per_block)} per block")
        dev = self.device
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        activation_peak = 0
        hf_model = getattr(model, "model", None)
        if hf_model is not None and profile_tokens > 0:
            activation_peak = _profile_peak_activations(hf_model, profile_tokens, dev)
        free, total = torch.cuda.mem_get_info(dev)
        in_use = total - free  # weights, CUDA context, other processes
        budget = int(total * utilization) - in_use - activation_peak
        blocks = budget // per_block
        note = (f"{max(blocks, 0)} blocks = {utilization:.0%} of {gib(total)} GPU memory "
                f"- {gib(in_use)} in use - {gib(activation_peak)} activation peak "
                f"(profiled forward of {profile_tokens} tokens), / {kib(per_block)} per block")
        if blocks < 1:
            raise RuntimeError(f"no GPU memory left for the KV cache: {note}")
        return int(blocks), note

    # ---- block operations ----------------------------------------------------------------------
    # Each runs under inference_mode, like the model runner: the pool works the same whether the
    # caller created it inside inference_mode (an "inference tensor") or not.

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: block src -> block dst for every (src, dst), all layers, one launch."""
        if not pairs:
            return
        self._loaded_first(pairs)
        src, dst = self._ids(pairs, self.num_gpu_blocks, self.num_gpu_blocks, self.device)
        self.ops.copy_blocks(self.kv_cache, src, dst)

    @torch.inference_mode()
    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Device block -> CPU block for every (gpu_id, cpu_id)."""
        if not pairs:
            return
        self._loaded_first(pairs)
        src, dst = self._ids(pairs, self.num_gpu_blocks, self.num_cpu_blocks, None)
        self.ops.swap_blocks(self.kv_cache, self.cpu_cache, src, dst)

    @torch.inference_mode()
    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """CPU block -> device block for every (cpu_id, gpu_id)."""
        if not pairs:
            return
        src, dst = self._ids(pairs, self.num_cpu_blocks, self.num_gpu_blocks, None)
        self.ops.swap_blocks(self.cpu_cache, self.kv_cache, src, dst)

    def offload(self, pairs: list[tuple[int, int]]) -> None:
        """Device block -> CPU tier slot for every (gpu_id, slot); the copy over the bus goes
        on by itself (tier_copies.py)."""
        if pairs:
            _checked(pairs, self.num_gpu_blocks, self.num_offload_blocks)
            self._loaded_first(pairs)
            self.tier.offload(self.kv_cache, pairs)

    def load(self, pairs: list[tuple[int, int]]) -> None:
        """CPU tier slot -> device block for every (slot, gpu_id); a forward pass that reads
        those blocks waits for it (`wait_for_loads`)."""
        if pairs:
            _checked(pairs, self.num_offload_blocks, self.num_gpu_blocks)
            self.tier.load(self.kv_cache, pairs)

    def fetch_ahead(self, slots: list[int]) -> None:
        """The bus copy of later loads of these tier slots in this step, started now
        (tier_copies.py)."""
        if slots:
            # the slots checked as a load's sources are (block 0 only stands in for a target)
            _checked([(s, 0) for s in slots], self.num_offload_blocks, self.num_gpu_blocks)
            self.tier.fetch_ahead(slots)

    def wait_for_loads(self, tables: Any, by_layer: bool = False) -> None:
        """Before a forward pass over these block tables: wait (on the device) for the loads
        from the CPU tier that write their blocks; `by_layer`: the pass waits before each part
        of the layers instead, where it can (tier_copies.py). Nothing to look at when none is
        in flight."""
        if self.tier is not None and self.tier.pending:
            # None (a dropped entry) never waits
            self.tier.wait_for_blocks(set().union(*tables), by_layer)

    def after_pass(self) -> None:
        """A forward pass was launched (tier_copies.py: when its layer events may be set again)."""
        if self.tier is not None:
            self.tier.after_pass()

    def _loaded_first(self, pairs: list[tuple[int, int]]) -> None:
        """A copy reading pool blocks whose load from the CPU tier may still be under way (a
        prompt loading over several steps, preempted or freed meanwhile) runs after that load,
        on the device like a forward pass would."""
        if self.tier is not None and self.tier.pending:
            self.tier.wait_for_blocks([src for src, _ in pairs])

    @torch.inference_mode()
    def save_blocks(self, gpu_ids: list[int], cpu_ids: list[int]) -> dict[str, Any]:
        """A copy of these blocks' K/V in every layer (engine/checkpoint.py)."""
        saved: dict[str, Any] = {"gpu_ids": list(gpu_ids), "cpu_ids": list(cpu_ids)}
        saved["gpu"] = self.kv_cache[:, :, list(gpu_ids)].clone()
        saved["cpu"] = self.cpu_cache[:, :, list(cpu_ids)].clone() if cpu_ids else None
        return saved

    @torch.inference_mode()
    def load_blocks(self, saved: dict[str, Any]) -> None:
        """Write saved blocks back where they were."""
        if saved["gpu_ids"]:
            self.kv_cache[:, :, saved["gpu_ids"]] = saved["gpu"]
        if saved["cpu_ids"]:
            self.cpu_cache[:, :, saved["cpu_ids"]] = saved["cpu"]

    @torch.inference_mode()
    def read_block(self, layer: int, block_id: int, cpu: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) of one block in one layer, float32 on the CPU, `[block_size, kv_heads, head_dim]`
        each: what the block inspector draws. `cpu=True` reads the swap space instead."""
        cache, count = (self.cpu_cache, self.num_cpu_blocks) if cpu else (self.kv_cache,
                                                                           self.num_gpu_blocks)
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in 0..{self.num_layers - 1}, got {layer}")
        if not 0 <= block_id < count:
            raise ValueError(f"block id must be in 0..{count - 1}, got {block_id}")
        if cpu and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # a swap out writes host memory asynchronously
        # copies: on a float32 CPU pool `.to` alone returns a view, which changes when the block
        # is written again
        slot = self.layout.layer_slot[layer]
        k = cache[slot, 0, block_id].to("cpu", torch.float32, copy=True)
        v = cache[slot, 1, block_id].to("cpu", torch.float32, copy=True)
        return k, v

    @staticmethod
    def _ids(pairs: list[tuple[int, int]], src_count: int, dst_count: int,
             device: torch.device | None) -> tuple[torch.Tensor, torch.Tensor]:
        srcs, dsts = _checked(pairs, src_count, dst_count)
        src_ids = torch.tensor(srcs, dtype=torch.long)
        dst_ids = torch.tensor(dsts, dtype=torch.long)
        if device is not None:
            src_ids, dst_ids = src_ids.to(device), dst_ids.to(device)
        return src_ids, dst_ids

    def describe(self) -> dict[str, Any]:
        """Sizes for the UI's "Engine" tab."""
        return {
            "device": str(self.device), "dtype": str(self.dtype).removeprefix("torch."),
            "kernels": self.ops.name, "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks, "num_cpu_blocks": self.num_cpu_blocks,
            "kv_bytes_per_token": self.kv_bytes_per_token, "bytes_per_block": self.bytes_per_block,
            "pool_bytes": self.bytes_per_block * self.num_gpu_blocks, "sizing": self.sizing_note,
        }


def _profile_peak_activations(model: Any, num_tokens: int, device: torch.device) -> int:
    """Peak bytes a forward of `num_tokens` tokens allocates beyond what was already allocated.

    A plain forward (no paged metadata) allocates about what a paged step of as many tokens does:
    activations and logits dominate, and the attention itself is small at this model size.
    """
    num_tokens = min(num_tokens, int(getattr(model.config, "max_position_embeddings", num_tokens)))
    input_ids = torch.zeros((1, num_tokens), dtype=torch.long, device=device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.inference_mode():
        model(input_ids=input_ids, use_cache=False)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    torch.cuda.empty_cache()
    return max(int(peak), 0)


def _checked(pairs: list[tuple[int, int]], src_count: int, dst_count: int
             ) -> tuple[list[int], list[int]]:
    """The pairs' source and destination ids, each checked against its pool before any byte
    moves, so a bad id leaves both pools as they were (the tier's copies take the pairs as
    they are: no index tensors made only to be dropped, on the host's part of a copy)."""
    srcs, dsts = [p[0] for p in pairs], [p[1] for p in pairs]
    if min(srcs) < 0 or max(srcs) >= src_count or min(dsts) < 0 or max(dsts) >= dst_count:
        src, dst = next((s, d) for s, d in pairs if not (0 <= s < src_count and 0 <= d < dst_count))
        raise ValueError(f"block pair ({src}, {dst}) out of range: source ids go up to "
                         f"{src_count - 1}, destination ids up to {dst_count - 1}")
    return srcs, dsts
