"""EngineConfig: what engine to build. Validated on creation, with messages that say what to fix."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from typing import Any

from engine.core.hashing import hash_function

MAX_BLOCK_SIZE = 128  # the Triton kernels handle block sizes 1..128
MAX_TENSOR_PARALLEL = 64  # worker processes; the model's KV heads bound it further
MAX_SPECULATIVE_TOKENS = 16  # draft slots per sequence and step
#: when a block goes to the CPU tier (EngineConfig.tier_store): when evicted, or once computed
TIER_STORES = ("evicted", "computed")
#: "1": engines whose config leaves track_kv_content None keep the content shadow (the tests)
TRACK_KV_CONTENT_ENV = "PAGEDLAB_TRACK_KV_CONTENT"


def _block_count(name: str, value: object) -> None:
    """A number of CPU blocks (swap space, the prefix cache's tier): 0 (none) up to 2**20."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 20:
        raise ValueError(f"{name} must be between 0 and {1 << 20}, got {value!r}")


def _positive_int(name: str, value: object, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if not 1 <= value <= high:
        raise ValueError(f"{name} must be between 1 and {high}, got {value}")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = "default"  # "default", "tiny-random", an HF id, a local path; None = dry
    block_size: int = 16
    num_gpu_blocks: int | None = 64  # None: size the pool from memory (real mode only)
    num_cpu_blocks: int = 0  # CPU swap space, in blocks
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"  # or "swap"
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    max_num_seqs: int = 256  # serving: sequences in one step
    max_num_batched_tokens: int = 2048  # serving: tokens in one step
    # serving: a prompt longer than what is left of a step's token budget is prefilled in
    # chunks, beside the running decodes (vLLM v1's chunked prefill); False: it waits, whole
    enable_chunked_prefill: bool = True
    # serving on a GPU: schedule and launch step t + 1 before reading step t's tokens back, so
    # the host's bookkeeping runs while the GPU computes (vLLM v1's async scheduling; see
    # engine/core/in_flight.py). The same outputs; a step's finished requests are reported one step later.
    async_scheduling: bool = False
    tensor_parallel_size: int = 1  # worker processes sharing the heads (engine/tp/runtime.py)
    # speculative decoding (engine/core/speculation.py): "ngram" proposes the k tokens that
    # followed the last occurrence of a sequence's last n tokens (n from prompt_lookup_max down
    # to prompt_lookup_min), verified in one pass; None: off
    # a CPU tier for the prefix cache (engine/core/offload_tier.py): cached blocks evicted from
    # the GPU pool keep their K/V in this many CPU blocks, and a prefix hit there copies them back
    num_offload_blocks: int = 0
    # when a block's K/V go to the tier: "evicted" (when the pool evicts it, the copy made before
    # its reuse) or "computed" (as soon as it is full and hashed, after the pass that computed
    # it: vLLM's offloading connector), so that an eviction later costs no copy
    tier_store: str = "evicted"
    speculative_method: str | None = None
    num_speculative_tokens: int = 0
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    # the dry mode's stand-in for a hybrid model (engine/core/kv_groups.py): a "sliding" KV cache
    # group with this window beside the "full" one. A real model's windows come from its own
    # config, so with a model this stays None
    sliding_window: int | None = None
    # keep a torch-free shadow of what every KV slot holds (engine/core/kv_content.py) and check
    # after each operation that every sequence's tables read back its own tokens' K/V: a copy
    # in the wrong order shows up there, with or without a model. It is the tests' oracle and a
    # debugging switch, and costs host time per token, so None means off in the product (dry
    # mode included) and on where the environment says so: PAGEDLAB_TRACK_KV_CONTENT=1, which
    # tests/conftest.py sets for every test
    track_kv_content: bool | None = None
    # the prefix cache's block hash (engine/core/hashing.py): "pagedlab" (the lab's xxh64 chain)
    # or one of vLLM's ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"), whose hashes equal
    # those vLLM publishes in its KV events for the same tokens. hash_seed plays vLLM's
    # PYTHONHASHSEED (the seed of its NONE_HASH): None is vLLM's default for the sha256 ones
    prefix_caching_hash_algo: str = "pagedlab"
    hash_seed: str | None = None

    def __post_init__(self) -> None:
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ValueError(f"model must be a name, a path or None (dry mode), got {self.model!r}")
        _positive_int("block_size", self.block_size, MAX_BLOCK_SIZE)
        if self.num_gpu_blocks is None:
            if self.model is None:
                raise ValueError("the dry mode needs num_gpu_blocks (there is no memory to size from)")
        else:
            _positive_int("num_gpu_blocks", self.num_gpu_blocks, 1 << 20)
        _block_count("num_cpu_blocks", self.num_cpu_blocks)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching must be True or False, "
                             f"got {self.enable_prefix_caching!r}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', "
                             f"got {self.preemption_mode!r}")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', "
                             f"got {self.dtype!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative whole number, got {self.seed!r}")
        _positive_int("max_num_seqs", self.max_num_seqs, 1 << 16)
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens, 1 << 20)
        _positive_int("tensor_parallel_size", self.tensor_parallel_size, MAX_TENSOR_PARALLEL)
        if not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling must be True or False, got {self.async_scheduling!r}")
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError(f"enable_chunked_prefill must be True or False, "
                             f"got {self.enable_chunked_prefill!r}")
        if self.tensor_parallel_size > 1 and self.model is None:
            raise ValueError("tensor parallelism splits a model's heads over workers; the dry "
                             "mode has no model (use tensor_parallel_size=1 or load a model)")
        _block_count("num_offload_blocks", self.num_offload_blocks)
        if self.tier_store not in TIER_STORES:
            raise ValueError(f"tier_store must be one of {', '.join(map(repr, TIER_STORES))}, "
                             f"got {self.tier_store!r}")
        if self.num_offload_blocks and self.tensor_parallel_size > 1:
            raise ValueError("the CPU tier (num_offload_blocks) is not built for tensor "
                             "parallelism yet: use tensor_parallel_size=1 or num_offload_blocks=0")
        self._check_speculation()
        self._check_hashing()
        if self.track_kv_content is not None and not isinstance(self.track_kv_content, bool):
            raise ValueError(f"track_kv_content must be True, False or None (as "
                             f"{TRACK_KV_CONTENT_ENV} says), got {self.track_kv_content!r}")
        if self.sliding_window is not None:
            _positive_int("sliding_window", self.sliding_window, 1 << 20)
            if self.model is not None:
                raise ValueError("sliding_window sets the dry mode's window; a model's windows "
                                 "come from its own config (leave sliding_window None)")

    def _check_speculation(self) -> None:
        if self.speculative_method not in (None, "ngram"):
            raise ValueError(f"speculative_method must be None (off) or 'ngram', "
                             f"got {self.speculative_method!r}")
        if self.speculative_method is None:
            return
        _positive_int("num_speculative_tokens", self.num_speculative_tokens, MAX_SPECULATIVE_TOKENS)
        _positive_int("prompt_lookup_min", self.prompt_lookup_min, 64)
        _positive_int("prompt_lookup_max", self.prompt_lookup_max, 64)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min ({self.prompt_lookup_min}) must not exceed "
                             f"prompt_lookup_max ({self.prompt_lookup_max})")

    def _check_hashing(self) -> None:
        if self.hash_seed is not None and not isinstance(self.hash_seed, str):
            raise ValueError(f"hash_seed must be None or a string (the value vLLM's PYTHONHASHSEED "
                             f"holds, e.g. '0'), got {self.hash_seed!r}")
        if not isinstance(self.prefix_caching_hash_algo, str):
            raise ValueError(f"prefix_caching_hash_algo must be a name, "
                             f"got {self.prefix_caching_hash_algo!r}")
        try:
            hash_function(self.prefix_caching_hash_algo, self.hash_seed)
        except ImportError as err:  # cbor2, for the *_cbor algorithms
            raise ValueError(f"prefix_caching_hash_algo={self.prefix_caching_hash_algo!r} needs "
                             f"the {err.name} package (pip install {err.name})") from err

    @property
    def dry(self) -> bool:
        return self.model is None

    @property
    def tracks_kv_content(self) -> bool:
        """Whether an engine of this config keeps the content shadow: `track_kv_content`, or
        where it is None the environment's PAGEDLAB_TRACK_KV_CONTENT ("1": the tests)."""
        if self.track_kv_content is not None:
            return self.track_kv_content
        return os.environ.get(TRACK_KV_CONTENT_ENV, "") == "1"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineConfig:
        if not isinstance(data, dict):
            raise ValueError(f"an engine config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown engine config field(s): {', '.join(unknown)}")
        return cls(**data)
