"""What an engine is, as the UI's Engine tab and the lessons read it: the mode, the pool and its
sizes, the scheduler's settings, the KV cache groups, then the runtime's own facts (model,
device, attention kernel; none in the dry mode)."""

from __future__ import annotations

from typing import Any

from engine.config import EngineConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.runtime.protocols import ModelRuntime


def engine_info(config: EngineConfig, kv: KVCacheManager, runtime: ModelRuntime
                ) -> dict[str, Any]:
    """One flat dict of labelled facts, in the order a reader meets them."""
    info: dict[str, Any] = {
        "mode": "dry (bookkeeping only: no model, no tensors)" if config.dry else "real model",
        "block size": config.block_size,
        "gpu blocks": kv.pool.num_blocks,
        "cpu swap blocks": kv.cpu_pool.num_blocks,
        "cpu tier blocks (prefix cache)": kv.tier.num_blocks,
        **({"cpu tier stores a block": "once computed" if config.tier_store == "computed"
            else "when the pool evicts it"} if kv.tier.num_blocks else {}),
        "prefix caching": config.enable_prefix_caching,
        "preemption": config.preemption_mode,
        "max tokens per sequence": runtime.max_model_len,
        "tensor_parallel_size": config.tensor_parallel_size,
        "speculative decoding": (f"{config.speculative_method}, up to "
                                 f"{config.num_speculative_tokens} draft tokens"
                                 if config.speculative_method else "off"),
        "kv_cache_groups": [{"name": g.name, "layers": list(g.layers), "window": g.window}
                            for g in kv.groups],
    }
    info.update(runtime.info())
    return info
