"""The real-mode runtime behind LLMEngine: the model, the KV tensors, one forward per call.

LLMEngine's bookkeeping decides which slots every token goes to; this wires that to tensors:
load the shared model (models.py), allocate the paged pool (cache_engine.py), run a batch
(model_runner.py), and wrap the logits for sampling (sampler.py). It implements the
`ModelRuntime` contract of protocols.py, as `tp.runtime.TPRuntime` does with worker processes.

`close()` frees the KV pool, the decode graphs and the sampler's workspace at once. Nothing in
here points back at its owner (the decode graphs hold the runner weakly), so a dropped engine
frees them too without waiting for a garbage collection.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import torch

from engine.config import EngineConfig
from engine.runtime.cache_engine import DEFAULT_PROFILE_TOKENS, CacheEngine
from engine.runtime.collector import settle_heap
from engine.runtime.model_runner import ModelRunner
from engine.runtime.models import load_model
from engine.runtime.protocols import Feed, StepItem
from engine.runtime.sampler import TorchScores
from engine.runtime.step_clock import StepClock


class Runtime:
    """The model, its KV pool and one forward pass a call, in this process."""

    def __init__(self, config: EngineConfig) -> None:
        self.loaded = load_model(config.model, config.device, config.dtype)
        self.cache = CacheEngine(
            self.loaded, config.num_gpu_blocks, config.block_size, config.num_cpu_blocks,
            device=self.loaded.device, dtype=self.loaded.dtype,
            num_offload_blocks=config.num_offload_blocks,
        )
        # a verification of k drafts is a static step of k + 1 queries a sequence
        drafts = config.num_speculative_tokens if config.speculative_method else 0
        # steps with chunks of prompts run as graphs where decodes do (a GPU); with a pool
        # sized from free memory, only as long as the steps that sizing left room for
        chunks = config.max_num_batched_tokens if self.cache.device.type == "cuda" else None
        if chunks and config.num_gpu_blocks is None:
            chunks = min(chunks, DEFAULT_PROFILE_TOKENS)
        self.runner = ModelRunner(self.loaded, self.cache, max_batch=min(config.max_num_seqs, 512),
                                  max_query=1 + drafts, prefill_tokens=chunks)
        # the tests track content: the device's decode tables are then checked every step too
        self.runner.graphs.check_tables = config.tracks_kv_content
        # what steps cost here, for the drafts' choice: measured where graphs replay (a GPU)
        self._clock = StepClock() if drafts and self.runner.graphs.use_graphs else None
        self._overlaps = config.async_scheduling
        self.tokenizer = HFTokenizer(self.loaded.tokenizer)
        self.vocab_size = int(self.loaded.vocab_size)
        self.eos_token_ids = tuple(self.loaded.eos_token_ids)
        self.kv_cache_groups = self.cache.layout.groups  # one block table per group and sequence
        self.num_layers = int(self.loaded.num_layers)
        self.num_gpu_blocks = self.cache.num_gpu_blocks
        self.max_model_len = min(int(self.loaded.max_position_embeddings),
                                 self.num_gpu_blocks * config.block_size)
        self.warm_up_seconds = self.runner.warm_up(_log) if _should_warm_up(self.loaded) else 0.0
        if self.warm_up_seconds:
            self.loaded.warmed_up = True
            if self.runner.graphs.use_graphs:  # a serving engine on a GPU, warm
                settle_heap()

    def execute(self, items: Sequence[StepItem], feed: Feed | None = None) -> TorchScores:
        """One forward pass over `items` (engine/runtime/protocols.py's StepItem).
        feed (async scheduling): ([(item, row)], tokens): item's one new token is still on the
        device, at tokens[row] (the last step's picks)."""
        self._check_open()
        batch = list(items)
        # blocks coming back from the CPU tier: this pass waits for their copy (on the device)
        self.cache.wait_for_loads((t for s in batch for t in s.tables()), self.runner.waits_by_layer)
        if self._clock is not None:
            self._clock.tick(_kind(batch), self.runner.graphs.bucket(min(
                len(batch), self.runner.graphs.max_batch)))
        scores = self.runner.execute_scores(batch, feed)
        self.cache.after_pass()
        return scores

    def draft_cost(self, num_seqs: int, q: int) -> float:
        """A step of num_seqs sequences verifying q - 1 draft tokens each, against a decode step
        (speculative decoding drafts only where that pays: engine/core/draft_policy.py). Where
        steps replay graphs, as this runtime's own steps measured it (engine/runtime/
        step_clock.py: a verification's lost overlap included); until both kinds were seen,
        the graphs' GPU times with a margin of 5%, plus a whole step for the lost overlap under
        async scheduling. On a CPU the fixed share per draft token of the graphs' default."""
        graphs = self.runner.graphs
        prior = 1.05 * graphs.cost_ratio(num_seqs, q)
        if self._clock is None:
            return prior
        measured = self._clock.ratio(graphs.bucket(min(num_seqs, graphs.max_batch)))
        return measured if measured is not None else prior + (1.0 if self._overlaps else 0.0)

    def step_costs(self) -> dict[str, float]:
        """The median wall time (ms) of decode and verification steps by batch bucket, as
        measured for speculative decoding's choice (empty where nothing is measured)."""
        return self._clock.seen() if self._clock is not None else {}

    def primitive_token(self, pending_token: int | None) -> int:
        """The model's pending pick."""
        return pending_token

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self._check_open()
        self.cache.copy_blocks(list(pairs))

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        self._check_open()
        self.cache.swap_out(pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        self._check_open()
        self.cache.swap_in(pairs)

    def offload(self, pairs: list[tuple[int, int]]) -> None:
        self._check_open()
        self.cache.offload(pairs)

    def load(self, pairs: list[tuple[int, int]]) -> None:
        self._check_open()
        self.cache.load(pairs)

    def fetch_ahead(self, slots: list[int]) -> None:
        self._check_open()
        self.cache.fetch_ahead(slots)

    can_save_blocks = True

    def save_blocks(self, gpu_ids: list[int], cpu_ids: list[int]) -> Any:
        """The K/V bytes of these pool and swap-space blocks, for a checkpoint."""
        self._check_open()
        return self.cache.save_blocks(gpu_ids, cpu_ids)

    def load_blocks(self, saved: Any) -> None:
        self._check_open()
        self.cache.load_blocks(saved)

    @staticmethod
    def saved_bytes(saved: Any) -> int:
        return sum(t.numel() * t.element_size() for t in (saved["gpu"], saved["cpu"])
                   if t is not None)

    def close(self) -> None:
        """Free the KV pool, swap space, decode graphs and sampler workspace now (idempotent).
        The model's weights are shared by every engine in the process and stay loaded."""
        self.runner.close()
        self.cache.close()

    @property
    def closed(self) -> bool:
        return self.cache.closed

    def _check_open(self) -> None:
        if self.cache.closed:
            raise RuntimeError("this engine was closed: its KV pool is freed; build a new engine")

    def kv_bytes_per_rank(self) -> list[int]:
        return [self.cache.bytes_per_block * self.num_gpu_blocks]

    def module_path(self) -> Any:
        return self.runner.module_path()

    def info(self) -> dict[str, Any]:
        lm = self.loaded
        return {
            "model": lm.name,
            "loaded from": lm.source,
            "device": str(lm.device),
            "dtype": str(lm.dtype).replace("torch.", ""),
            "layers": lm.num_layers,
            "query heads": lm.num_q_heads,
            "kv heads": lm.num_kv_heads,
            "head dim": lm.head_dim,
            "attention kernel": self.cache.ops.name,
            "layer path": ("lean decoder (fused layer kernels)" if self.runner.lean is not None
                           else "the model's own modules"),
            "decode steps": ("replayed as CUDA graphs" if self.runner.graphs.use_graphs
                             else "run eagerly from static buffers"),
            "kv bytes per token": self.cache.kv_bytes_per_token,
            "kv bytes per block": self.cache.bytes_per_block,
            "pool size": self.cache.sizing_note,
            "tokens computed by the model": self.runner.num_tokens_computed,
            "start-up warm-up (s)": round(self.warm_up_seconds, 2),
            "kv_bytes_per_rank": self.kv_bytes_per_rank(),
        }

    def read_block(self, block_id: int, layer: int, rank: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) of one block in one layer (float32 on the CPU); one process is rank 0."""
        if rank not in (None, 0) or isinstance(rank, bool):
            raise ValueError(f"rank must be 0 without tensor parallelism, got {rank!r}")
        self._check_open()
        return self.cache.read_block(layer, block_id)


_TOKEN_IDS, _NUM_LOGITS = attrgetter("token_ids"), attrgetter("num_logits")


def _kind(batch: list[StepItem]) -> str | None:
    """"decode" (one token a sequence), "verify" (a sequence verifies a draft) or None. At C
    speed: a drafting engine asks it every step, of every sequence."""
    if max(map(len, map(_TOKEN_IDS, batch)), default=1) == 1:
        return "decode"
    return "verify" if max(map(_NUM_LOGITS, batch), default=1) > 1 else None


def _should_warm_up(loaded: Any) -> bool:
    """No cold first user: on a GPU an engine compiles its kernels and captures every decode
    graph at start (a few seconds, said on stderr), so a server's first requests do not pay
    for it. PAGEDLAB_WARMUP says when:

    - "1" (the default: servers, benchmarks): every engine;
    - "once" (what app.py sets): the first engine of each loaded model in this process. The app
      builds an engine per session and replays one on every Back, where seconds of capture
      would land on each click; the kernels stay compiled in the process, and a later engine
      captures a graph the first time it meets that batch size (one size at a time);
    - "0": never.

    Never on a ZeroGPU Space: there the GPU lives for one call and each call rebuilds the engine
    by replay, so warming every bucket would cost every click."""
    if os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true"):
        return False
    policy = os.environ.get("PAGEDLAB_WARMUP", "1")
    if policy == "once":
        return not loaded.warmed_up
    return policy != "0"


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class HFTokenizer:
    """The few tokenizer calls the engine makes, on a Hugging Face tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.hf = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text))

    def decode(self, token_ids: list[int]) -> str:
        return self.hf.decode(list(token_ids))

    def apply_chat_template(self, message: str, system: str = "") -> list[int]:
        """The model's chat prompt for one user message (after `system`, if given)."""
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": message})
        ids = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
