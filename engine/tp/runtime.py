"""The engine's side of tensor parallelism (paper §4.6): N worker processes, one block table.

`TPRuntime` stands in for `runtime.Runtime` when `EngineConfig.tensor_parallel_size > 1`. The
engine process keeps everything that decides: the scheduler, the block tables, prefix caching,
copy-on-write, preemption, sampling and the op log. It holds no weights and no KV tensors. The
N workers (engine/tp/worker.py, each its own `python -m`, started by engine/tp/link.py) hold a
shard of the heads each and their slice of every block.

Why the engine is not itself rank 0 (as vLLM's driver worker is): the app runs one engine per
browser session inside one process, and a process can join only one default process group;
a separate scheduler process also survives a crashing worker to report it. The cost is one more
hop for what the sampler needs (worker 0 -> engine).

Each step is one message through shared memory (engine/tp/step_message.py). A step the workers
run from their decode buffers (decodes, drafts, short prompt rests) sends only its tokens,
positions and the table entries that changed (engine/tp/device_batch.py keeps the rows); any
other step sends its items whole. Copies and swaps ride with the next message, in order. Worker
0 replies with each row's greedy pick (16 bytes a row); the full logits follow only when a
request samples or searches beams (`RemoteScores`). Under async scheduling the reply is read
when the step lands, and the next step's greedy tokens are read on the workers.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from engine.config import EngineConfig
from engine.core.kv_groups import groups_of
from engine.runtime.collector import settle_heap
from engine.runtime.protocols import Feed, StepItem
from engine.tp.device_batch import DeviceBatch, GraphSpec
from engine.tp.link import START_TIMEOUT_S, TensorParallelError, start_link
from engine.tp.remote_scores import RemoteScores, StepReply, WorkerTokens
from engine.tp.shard import check_tp_size
from engine.tp.step_message import check_tail, encode_device_step, encode_object
from engine.tp.symm_allreduce import summary

__all__ = ["TPRuntime", "TensorParallelError", "WireStats"]


@dataclass
class WireStats:
    """What crossed the wire in the last step that ran the model."""

    message_bytes: int = 0  # engine -> every worker: the step's message, copies included
    logits_bytes: int = 0  # worker 0 -> engine: greedy picks, and logits where a request samples
    tokens: int = 0  # tokens the step computed
    all_reduces: int = 0  # among the workers: two per layer
    all_reduce_bytes: int = 0  # the payload of those all-reduces (each is tokens x hidden)
    device_step: bool = False  # whether the workers ran it from their decode buffers
    totals: dict[str, int] = field(default_factory=lambda: {"steps": 0, "message_bytes": 0,
                                                            "logits_bytes": 0, "device_steps": 0})


class TPRuntime:
    """The `ModelRuntime` contract (engine/runtime/protocols.py), served by
    `config.tensor_parallel_size` worker processes."""

    def __init__(self, config: EngineConfig, start_timeout_s: float = START_TIMEOUT_S) -> None:
        from engine.runtime.models import resolve_device

        n = config.tensor_parallel_size
        self.size = n
        device = resolve_device(config.device)
        if device.type == "cuda" and torch.cuda.device_count() < n:
            raise ValueError(f"tensor_parallel_size={n} needs {n} GPUs (one per rank); torch "
                             f"sees {torch.cuda.device_count()}")
        known = _peek_heads(config.model)
        if known is not None:  # fail before spawning anything when the config is at hand
            check_tp_size(n, known[0], known[1], config.model)
        # a benchmark may want a hung start or step to fail sooner than a server would
        start_timeout_s = float(os.environ.get("PAGEDLAB_TP_START_TIMEOUT_S", start_timeout_s))
        self._link = start_link(n, config.to_dict(), start_timeout_s)
        if "PAGEDLAB_TP_STEP_TIMEOUT_S" in os.environ:
            self._link.step_timeout_s = float(os.environ["PAGEDLAB_TP_STEP_TIMEOUT_S"])
        self.wire = WireStats()
        self.num_tokens_computed = 0
        self._async = config.async_scheduling
        self._steps = 0  # forward passes sent: which step's logits worker 0 holds
        self._replied = 0  # step replies read from worker 0
        self._unclaimed: dict[int, bytes] = {}  # replies read before their scores asked
        self._pending: list[tuple[str, list[tuple[int, int]]]] = []
        self._describe(dict(self._link.hello), config)
        self.batch = DeviceBatch(GraphSpec(**self.model_info["graphs"]),
                                 check=config.tracks_kv_content)
        if self.model_info["warm_up_seconds"]:  # the workers warmed their graphs: a GPU's serving
            settle_heap()

    def _describe(self, hello: dict[str, Any], config: EngineConfig) -> None:
        from engine.runtime.runtime import HFTokenizer

        self.tokenizer = HFTokenizer(hello.pop("tokenizer"))  # the one worker 0 loaded
        self.model_info = hello
        self.vocab_size = int(hello["vocab"])
        self.eos_token_ids = tuple(hello["eos"])
        self.num_gpu_blocks = int(hello["num_gpu_blocks"])
        self.kv_cache_groups = groups_of(hello["layer_windows"])
        self.max_model_len = min(int(hello["max_positions"]), self.num_gpu_blocks * config.block_size)
        self.block_size = config.block_size
        self.element_size = torch.empty((), dtype=getattr(torch, hello["dtype"])).element_size()
        self.num_layers = int(hello["layers"])
        self.loaded = SimpleNamespace(  # what lessons and inspect_block read of a loaded model
            name=hello["name"], num_layers=hello["layers"], num_q_heads=hello["q_heads"],
            num_kv_heads=hello["kv_heads"], head_dim=hello["head_dim"], dtype=hello["dtype"],
            max_position_embeddings=hello["max_positions"],
            config=SimpleNamespace(hidden_size=hello["hidden"]))

    @property
    def folder(self) -> str:
        """The private folder of the workers' rings and store (removed when they stop)."""
        return self._link.folder

    @property
    def step_timeout_s(self) -> float:
        """The longest a step may take before the engine calls a worker stuck."""
        return self._link.step_timeout_s

    @step_timeout_s.setter
    def step_timeout_s(self, seconds: float) -> None:
        self._link.step_timeout_s = seconds

    # ---- steps ----------------------------------------------------------------------------------

    def execute(self, items: Sequence[StepItem], feed: Feed | None = None) -> RemoteScores:
        """One forward pass over `items` (engine/runtime/protocols.py's StepItem), run by every
        worker. `feed` (async scheduling): items whose one new token the last step picked,
        read on the workers (or given by the host, for a sampled draw)."""
        self._link.check_usable()  # a failed step may have left tokens nobody will answer for
        items = list(items)
        fed = self._fed(items, feed)
        plan = self.batch.plan(items, [i for i, _ in fed])
        if plan is not None:  # the tables are read, not copied: only what changed is sent
            plan.feed = [v for pair in fed for v in pair]
            plan.cache_ops, self._pending = self._pending, []
            payload = encode_device_step(plan)
            checked = len(check_tail(plan))  # the tests' oracle rides along: not the wire's
        else:  # plain ints for the pickle
            items = [StepItem(list(map(int, it.token_ids)), int(it.num_computed),
                              _ids(it.block_table), int(it.num_logits),
                              tuple(map(_ids, it.group_tables)), it.key) for it in items]
            payload = encode_object({"cmd": "execute", "items": items, "feed": fed or None,
                                     "cache_ops": self._pending})
            self._pending, checked = [], 0
        rows = sum(it.num_logits for it in items)
        self._link.call(self._link.send, payload)
        self._steps += 1
        step = self._steps
        self._count(len(payload) - checked, 16 * rows, sum(len(it.token_ids) for it in items),
                    plan is not None)
        return RemoteScores(StepReply(lambda: self._reply_of(step)), rows, self._fetch_logits,
                            step, overlap=self._async)

    def _fed(self, items: list[StepItem], feed: Feed | None) -> list[tuple[int, int]]:
        """The (item, row) pairs whose token the workers read from their last picks; tokens a
        sampled draw left on the host are written into the items instead."""
        if not feed:
            return []
        pairs, where = feed
        if not isinstance(where, WorkerTokens):
            raise ValueError("a tensor-parallel step reads the last step's tokens from its own "
                             "workers' picks")
        if where.host is not None:
            for i, row in pairs:
                items[i] = items[i]._replace(token_ids=[where.host[row]])
            return []
        if where.step != self._steps:
            raise RuntimeError(f"a step reads the picks of step {where.step}, but the workers "
                               f"hold those of step {self._steps}")
        return [(int(i), int(r)) for i, r in pairs]

    def _reply_of(self, step: int) -> bytes:
        """Worker 0's reply to `step`."""
        return self._link.call(self._take_reply, step)

    def _take_reply(self, step: int) -> bytes | None:
        """Read worker 0's replies up to `step`'s (they come in order). Earlier ones wait for
        their scores: under async scheduling the step before may land after this one's picks
        were read; older ones nobody claimed (a prompt's chunk samples nothing) are dropped."""
        while self._replied < step:
            self._replied += 1
            self._unclaimed[self._replied] = self._link.reply(0, "picks")
        for old in [s for s in self._unclaimed if s < step - 1]:
            del self._unclaimed[old]
        return self._unclaimed.pop(step, None)

    def _ask(self, msg: dict[str, Any]) -> None:
        """A command to the workers (inside `call`), after every step reply worker 0 owes (its
        replies come in order), with the copies queued so far (the inspector must read them
        done)."""
        if self._replied < self._steps:
            self._unclaimed[self._steps] = self._take_reply(self._steps)
        msg["cache_ops"], self._pending = self._pending, []
        self._link.send_object(msg)

    def _fetch_logits(self, step: int, rows: int) -> torch.Tensor:
        """The full logits of step `step`, which worker 0 still holds if no step came since."""
        if step != self._steps:
            raise RuntimeError("these scores belong to an earlier step; worker 0 keeps only the "
                               "last step's logits")

        def run() -> torch.Tensor:
            self._ask({"cmd": "logits"})
            raw = self._link.reply(0, "logits")
            return torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy()).view(rows, -1)

        logits = self._link.call(run)
        self.wire.logits_bytes += logits.numel() * 4
        self.wire.totals["logits_bytes"] += logits.numel() * 4
        return logits

    def _count(self, sent: int, back: int, tokens: int, device_step: bool) -> None:
        layers, hidden = self.model_info["layers"], self.model_info["hidden"]
        w = self.wire
        w.message_bytes, w.logits_bytes, w.tokens = sent, back, tokens
        w.all_reduces = 2 * layers
        w.all_reduce_bytes = 2 * layers * tokens * hidden * self.element_size
        w.device_step = device_step
        w.totals["steps"] += 1
        w.totals["device_steps"] += device_step
        w.totals["message_bytes"] += sent
        w.totals["logits_bytes"] += back
        self.num_tokens_computed += tokens

    def step_timings(self) -> dict[str, Any]:
        """Worker 0's timings of its device steps since the last call (ms: host work from the
        message to the graph's launch, the graph's GPU time, the whole step there), when its
        process was started with PAGEDLAB_TP_TIMING=1; and the engine's time spent waiting for
        replies (s, summed). For the bench."""
        def run() -> dict[str, Any]:
            self._ask({"cmd": "stats"})
            return pickle.loads(self._link.reply(0, "stats"))

        return self._link.call(run) | {"engine_wait_s": self._link.wait_s}

    @property
    def reply_wait_s(self) -> float:
        """Seconds the engine has spent waiting for the workers' replies, summed (the bench
        takes it from a step's time to find the engine's own host work)."""
        return self._link.wait_s

    def draft_cost(self, num_seqs: int, q: int) -> float:
        """A verification against a decode step, as worker 0 measured its graphs (a CPU: the
        default estimate), with a 5% margin, as the one-process runtime."""
        return 1.05 * self.batch.cost_ratio(num_seqs, q)

    def primitive_token(self, pending_token: int | None) -> int:
        """The model's pending pick."""
        return pending_token

    # ---- block copies: they ride with the next message, in order ------------------------------

    #: the bytes live in the worker processes: a checkpoint would have to gather every rank's
    can_save_blocks = False

    def save_blocks(self, gpu_ids: list[int], cpu_ids: list[int]) -> Any:
        raise ValueError("a checkpoint cannot save K/V bytes that live in tensor-parallel workers")

    def load_blocks(self, saved: Any) -> None:
        raise ValueError("a checkpoint cannot load K/V bytes into tensor-parallel workers")

    @staticmethod
    def saved_bytes(saved: Any) -> int:
        return 0

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._pending.append(("copy_blocks", [(int(a), int(b)) for a, b in pairs]))

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._pending.append(("swap_out", [(int(a), int(b)) for a, b in pairs]))

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._pending.append(("swap_in", [(int(a), int(b)) for a, b in pairs]))

    def offload(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:  # EngineConfig refuses a CPU tier with tensor parallelism
            raise ValueError("the CPU tier is not built for tensor parallelism")

    load = offload

    def fetch_ahead(self, slots: list[int]) -> None:
        self.offload([(0, s) for s in slots])  # refused, as the tier's other copies are

    def read_block(self, block_id: int, layer: int, rank: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) of one block in one layer, float32 `[block_size, kv_heads, head_dim]`: every
        rank's slice side by side, or only rank `rank`'s (`kv_heads / N` heads)."""
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)
                                 or not 0 <= rank < self.size):
            raise ValueError(f"rank must be a whole number from 0 to {self.size - 1}, got {rank!r}")
        ranks = list(range(self.size)) if rank is None else [rank]
        shape = (2, self.block_size, self.model_info["kv_heads"] // self.size,
                 self.model_info["head_dim"])

        def run() -> list[torch.Tensor]:
            self._ask({"cmd": "read_block", "layer": layer, "block": block_id, "ranks": ranks})
            return [torch.from_numpy(np.frombuffer(self._link.reply(r, "block"),
                                                   dtype=np.float32).copy()).view(shape)
                    for r in ranks]

        kv = torch.cat(self._link.call(run), dim=2)  # heads of rank 0, then rank 1, ...
        return kv[0], kv[1]

    def kv_bytes_per_rank(self) -> list[int]:
        return [self.model_info["bytes_per_block_rank"] * self.num_gpu_blocks] * self.size

    def module_path(self) -> Any:
        raise ValueError("the attention probe needs a real model in one process: its modules run "
                         "inside the worker processes here")

    def info(self) -> dict[str, Any]:
        h, w = self.model_info, self.wire
        graphs = h["graphs"]["use_graphs"]
        return {
            "model": h["name"], "loaded from": h["source"],
            "device": f"{self.size} worker processes ({h['device'].split(':')[0]}, one "
                      f"{'GPU' if h['device'].startswith('cuda') else 'process'} per rank)",
            "dtype": h["dtype"], "layers": h["layers"], "query heads": h["q_heads"],
            "kv heads": h["kv_heads"], "head dim": h["head_dim"],
            "attention kernel": h["kernel"], "layer path": h["layer_path"],
            "decode steps": ("replayed as CUDA graphs on every rank, all-reduces inside"
                             if graphs else "run eagerly from each rank's decode buffers"),
            "all-reduce": summary(h["allreduce"]),
            "kv bytes per token": h["kv_bytes_per_token_rank"] * self.size,
            "kv bytes per block": h["bytes_per_block_rank"] * self.size,
            "pool size": h["sizing"],
            "tokens computed by the model": self.num_tokens_computed,
            "vocab size": h["logits_dim"],
            "kv heads per rank": h["kv_heads"] // self.size,
            "query heads per rank": h["q_heads"] // self.size,
            "kv bytes per block per rank": h["bytes_per_block_rank"],
            "weight bytes per rank": h["weight_bytes_rank"],
            "device bytes allocated on rank 0 (at start)": h["device_bytes_allocated"],
            "start-up warm-up on rank 0 (s)": round(h["warm_up_seconds"], 2),
            "tp last step: message bytes": w.message_bytes,
            "tp last step: bytes back from rank 0": w.logits_bytes,
            "tp last step: all-reduces": w.all_reduces,
            "tp last step: all-reduce bytes": w.all_reduce_bytes,
            "tp last step: from the decode buffers": w.device_step,
            "worker pids": self._link.pids,
            "kv_bytes_per_rank": self.kv_bytes_per_rank(),
        }

    def close(self) -> None:
        """Stop the workers (idempotent): their KV pools and graphs go with their processes."""
        self._link.close()

    @property
    def closed(self) -> bool:
        return self._link.stopped

    @property
    def alive(self) -> bool:
        return not self._link.stopped


def _ids(table: Sequence[int | None]) -> list[int | None]:
    """A block table for the wire: plain ints, None where a sliding window dropped a block."""
    return [None if b is None else int(b) for b in table]


def _peek_heads(model: str | None) -> tuple[int, int] | None:
    """(query heads, KV heads) when they are at hand without loading anything (a model built in
    code, a local folder's config.json, the default model's converted cache); else None."""
    from engine.runtime.models import DEFAULT_CACHE_NAME, cache_root
    from engine.runtime.tiny_models import SHAPES

    if model is None:
        return None
    if model in SHAPES:  # built in code: its shape is at hand
        return SHAPES[model]["num_attention_heads"], SHAPES[model]["num_key_value_heads"]
    folder = cache_root() / DEFAULT_CACHE_NAME if model == "default" else Path(model).expanduser()
    try:
        cfg = json.loads((folder / "config.json").read_text())
        q = int(cfg["num_attention_heads"])
        return q, int(cfg.get("num_key_value_heads") or q)
    except (OSError, ValueError, KeyError, TypeError):
        return None
