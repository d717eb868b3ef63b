"""The engine's side of tensor parallelism (paper §4.6): N worker processes, one block table.

`TPRuntime` stands in for `runtime.Runtime` when `EngineConfig.tensor_parallel_size > 1`. The
engine process keeps everything that decides: the scheduler, the block tables, prefix caching,
copy-on-write, preemption, sampling and the op log. It holds no weights and no KV tensors. The
N workers (engine/tp/worker.py, each its own `python -m`, started by engine/tp/launch.py) hold
a shard of the heads each and their slice of every block.

Why the engine is not itself rank 0 (as vLLM's driver worker is): the app runs one engine per
browser session inside one process, and a process can join only one default process group;
a separate scheduler process also survives a crashing worker to report it. The cost is one more
hop for what the sampler needs (worker 0 -> engine).

Per step the engine sends one message (tokens, positions as `num_computed`, block tables, and
the copy / swap lists queued since the last step) and gets back from worker 0 each row's greedy
token and log probability; the full logits follow only when a request samples or searches beams
(`RemoteScores`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.core.kv_groups import groups_of
from engine.runtime.decode_graphs import DEFAULT_VERIFY_COST
from engine.runtime.protocols import Feed, StepItem
from engine.tp.comm import PollingWaiter, broadcast_object, gloo_group
from engine.tp.launch import Workers, start_workers, stop_workers
from engine.tp.remote_scores import RemoteScores
from engine.tp.shard import check_tp_size

START_TIMEOUT_S = 600.0  # loading and sharding a model in every worker
STEP_TIMEOUT_S = 120.0  # the longest a step may take before the engine calls a worker stuck
_START_HINT = " (its output, if it left any, is on stderr above)"


class TensorParallelError(RuntimeError):
    """A tensor-parallel worker died, hung or failed; the engine stopped all of them."""


@dataclass
class WireStats:
    """What crossed the wire in the last step that ran the model."""

    message_bytes: int = 0  # engine -> every worker: tokens, block tables, copy / swap lists
    logits_bytes: int = 0  # worker 0 -> engine: greedy picks, and logits where a request samples
    tokens: int = 0  # tokens the step computed
    all_reduces: int = 0  # among the workers: two per layer
    all_reduce_bytes: int = 0  # the payload of those all-reduces (each is tokens x hidden)
    totals: dict[str, int] = field(default_factory=lambda: {"steps": 0, "message_bytes": 0,
                                                            "logits_bytes": 0})


class TPRuntime:
    """The `ModelRuntime` contract (engine/runtime/protocols.py), served by
    `config.tensor_parallel_size` worker processes."""

    def __init__(self, config: EngineConfig, start_timeout_s: float = START_TIMEOUT_S) -> None:
        from engine.runtime.models import resolve_device

        n = config.tensor_parallel_size
        self.size = n
        self.step_timeout_s = STEP_TIMEOUT_S
        device = resolve_device(config.device)
        if device.type == "cuda" and torch.cuda.device_count() < n:
            raise ValueError(f"tensor_parallel_size={n} needs {n} GPUs (one per rank); torch "
                             f"sees {torch.cuda.device_count()}")
        known = _peek_heads(config.model)
        if known is not None:  # fail before spawning anything when the config is at hand
            check_tp_size(n, known[0], known[1], config.model)
        folder = tempfile.mkdtemp(prefix="pagedlab-tp-")  # private (0700): the store's file
        store = dist.FileStore(os.path.join(folder, "store"), n + 1)
        store.set_timeout(timedelta(seconds=start_timeout_s))
        threads = max(1, (os.cpu_count() or 1) // n)
        self._w = Workers([], store, folder)
        self._finalizer = weakref.finalize(self, stop_workers, self._w, True)
        self._error: str | None = None
        self.wire = WireStats()
        self.num_tokens_computed = 0
        self._steps = 0  # forward passes run: which step's logits worker 0 holds
        try:
            self._w.procs, self._w.lifeline = start_workers(
                n, folder, os.path.join(folder, "store"), config.to_dict(), threads)
            self._await_ready(start_timeout_s)
            self._w.ctl = gloo_group(store, "ctl", 0, n + 1, start_timeout_s)
            self._w.replies = [gloo_group(store, f"reply{r}", 0, 2, start_timeout_s)
                               for r in range(n)]
            hello, _ = broadcast_object(self._w.replies[0], None, 1, 0,
                                        PollingWaiter(self._check_alive, start_timeout_s))
        except BaseException as err:
            stop_workers(self._w, polite=False)
            if isinstance(err, ValueError) or not isinstance(err, Exception):
                raise  # a bad setting (the user's fix), or Ctrl-C
            hint = _START_HINT if "no error report" in str(err) else ""
            if isinstance(err, TensorParallelError):
                raise TensorParallelError(f"{err}{hint}") from err
            raise TensorParallelError(f"starting {n} tensor-parallel workers failed: "
                                      f"{type(err).__name__}: {err}{hint}") from err
        self._describe(hello, config)
        self._pending: list[tuple[str, list[tuple[int, int]]]] = []

    # ---- startup --------------------------------------------------------------------------------

    def _await_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        store, n = self._w.store, self.size
        while not all(store.check([f"ready/{r}"]) for r in range(n)):
            errors = self._worker_errors()
            bad = [e for e in errors.values() if e.startswith("ValueError")]
            if bad:  # a bad setting (e.g. a size that does not divide the heads): the user's fix
                raise ValueError(bad[0].removeprefix("ValueError: "))
            self._check_alive()
            if time.monotonic() > deadline:
                raise TensorParallelError(f"the {n} tensor-parallel workers were not ready "
                                          f"within {timeout_s:g} s")
            time.sleep(0.05)

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

    # ---- health ---------------------------------------------------------------------------------

    def _worker_errors(self) -> dict[int, str]:
        out = {}
        for r in range(self.size):
            key = f"error/{r}"
            if self._w.store.check([key]):
                out[r] = self._w.store.get(key).decode(errors="replace")
        return out

    def _check_alive(self) -> None:
        dead = [(r, p) for r, p in enumerate(self._w.procs) if p.exitcode is not None]
        if dead:
            time.sleep(0.05)  # let a dying worker's report reach the store
            errors = self._worker_errors()
            parts = []
            for r, p in dead:
                why = errors.get(r, "no error report: killed or crashed")
                parts.append(f"rank {r} (pid {p.pid}) exited with code {p.exitcode}: {why}")
            raise TensorParallelError("tensor-parallel worker died: " + "; ".join(parts))

    def _call(self, fn: Any, *args: Any) -> Any:
        """Run one exchange with the workers; any failure stops them all and is reported."""
        if self._error is not None:
            raise TensorParallelError(f"{self._error}. This engine's workers are stopped; build a "
                                      f"new engine (the session replays its log)")
        if self._w.stopped:
            raise TensorParallelError("this engine was closed and its workers are stopped; build "
                                      "a new engine")
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001 - dead peer, timeout, transport error
            msg = str(err) if isinstance(err, TensorParallelError | TimeoutError) else (
                f"talking to the tensor-parallel workers failed ({type(err).__name__}: "
                f"{str(err)[:300]})")
            # A closed connection usually means a worker died: wait briefly for its exit status
            # (the fork server reports it a moment later) so the message can name it.
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                try:
                    self._check_alive()
                except TensorParallelError as dead:
                    msg = str(dead)
                    break
                if isinstance(err, TimeoutError):
                    break  # a stuck worker is alive: nothing to wait for
                time.sleep(0.02)
            self._error = msg
            stop_workers(self._w, polite=False)
            raise TensorParallelError(f"{msg}; the engine stopped all {self.size} workers") from err

    def _send(self, msg: dict[str, Any]) -> int:
        msg["cache_ops"], self._pending = self._pending, []
        waiter = PollingWaiter(self._check_alive, self.step_timeout_s)
        return broadcast_object(self._w.ctl, msg, 0, 0, waiter)[1]

    def _receive(self, rank: int, out: torch.Tensor) -> torch.Tensor:
        waiter = PollingWaiter(self._check_alive, self.step_timeout_s)
        waiter(self._w.replies[rank].broadcast(out, 1), f"reply of rank {rank}")
        return out

    # ---- Runtime's interface --------------------------------------------------------------------

    def execute(self, items: Sequence[StepItem], feed: Feed | None = None) -> RemoteScores:
        """One forward pass over `items` (engine/runtime/protocols.py's StepItem), run by every
        worker. No `feed`: the picks of these scores come back over the wire (`can_overlap` is
        False), so no step starts before the host has its tokens."""
        if feed:
            raise ValueError("a tensor-parallel step cannot read tokens left on a device: its "
                             "scores never overlap (RemoteScores.can_overlap is False)")
        # plain ints for the wire; no key: the workers run every step eagerly (no device rows)
        items = [StepItem(list(map(int, it.token_ids)), int(it.num_computed), _ids(it.block_table),
                          int(it.num_logits), tuple(map(_ids, it.group_tables))) for it in items]
        rows = sum(it.num_logits for it in items)

        def run() -> torch.Tensor:
            sent = self._send({"cmd": "execute", "items": items})
            picks = self._receive(0, torch.empty((rows, 2), dtype=torch.float64))
            self._count(sent, picks, sum(len(it.token_ids) for it in items))
            return picks

        picks = self._call(run)
        self._steps += 1
        greedy = [(int(t), float(lp)) for t, lp in picks.tolist()]
        return RemoteScores(greedy, self._fetch_logits, self._steps)

    def _fetch_logits(self, step: int, rows: int) -> torch.Tensor:
        """The full logits of step `step`, which worker 0 still holds if no step came since."""
        if step != self._steps:
            raise RuntimeError("these scores belong to an earlier step; worker 0 keeps only the "
                               "last step's logits")

        def run() -> torch.Tensor:
            self._send({"cmd": "logits"})
            return self._receive(0, torch.empty((rows, self.model_info["logits_dim"]),
                                                dtype=torch.float32))

        logits = self._call(run)
        self.wire.logits_bytes += logits.numel() * 4
        self.wire.totals["logits_bytes"] += logits.numel() * 4
        return logits

    def _count(self, sent: int, picks: torch.Tensor, tokens: int) -> None:
        layers, hidden = self.model_info["layers"], self.model_info["hidden"]
        w = self.wire
        w.message_bytes, w.logits_bytes, w.tokens = sent, picks.numel() * 8, tokens
        w.all_reduces = 2 * layers
        w.all_reduce_bytes = 2 * layers * tokens * hidden * self.element_size
        w.totals["steps"] += 1
        w.totals["message_bytes"] += sent
        w.totals["logits_bytes"] += w.logits_bytes
        self.num_tokens_computed += tokens

    # Copies and swaps ride with the next message, in order: every rank applies them to its own
    # slice of the same block ids before it runs that step.
    def draft_cost(self, num_seqs: int, q: int) -> float:
        """Workers run every step eagerly (no graphs): a verification costs about what one on a
        CPU does over its decode (engine/runtime/decode_graphs.py's default), with a 5% margin."""
        return 1.05 * (1.0 + DEFAULT_VERIFY_COST * (q - 1))

    def primitive_token(self, pending_token: int | None) -> int:
        """The model's pending pick."""
        return pending_token

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
            self._pending.append(("copy_blocks", [tuple(p) for p in pairs]))

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._pending.append(("swap_out", [tuple(p) for p in pairs]))

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._pending.append(("swap_in", [tuple(p) for p in pairs]))

    def offload(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:  # EngineConfig refuses a CPU tier with tensor parallelism
            raise ValueError("the CPU tier is not built for tensor parallelism")

    load = offload

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
            self._send({"cmd": "read_block", "layer": layer, "block": block_id, "ranks": ranks})
            return [self._receive(r, torch.empty(shape, dtype=torch.float32)) for r in ranks]

        kv = torch.cat(self._call(run), dim=2)  # heads of rank 0, then rank 1, ...
        return kv[0], kv[1]

    def kv_bytes_per_rank(self) -> list[int]:
        return [self.model_info["bytes_per_block_rank"] * self.num_gpu_blocks] * self.size

    def module_path(self) -> Any:
        raise ValueError("the attention probe needs a real model in one process: its modules run "
                         "inside the worker processes here")

    def info(self) -> dict[str, Any]:
        h = self.model_info
        w = self.wire
        return {
            "model": h["name"], "loaded from": h["source"],
            "device": f"{self.size} worker processes ({h['device'].split(':')[0]}, one "
                      f"{'GPU' if h['device'].startswith('cuda') else 'process'} per rank)",
            "dtype": h["dtype"], "layers": h["layers"], "query heads": h["q_heads"],
            "kv heads": h["kv_heads"], "head dim": h["head_dim"],
            "attention kernel": h["kernel"], "layer path": h["layer_path"],
            "decode steps": "run eagerly (CUDA graphs are off under tensor parallelism)",
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
            "tp last step: message bytes": w.message_bytes,
            "tp last step: bytes back from rank 0": w.logits_bytes,
            "tp last step: all-reduces": w.all_reduces,
            "tp last step: all-reduce bytes": w.all_reduce_bytes,
            "worker pids": [p.pid for p in self._w.procs],
            "kv_bytes_per_rank": self.kv_bytes_per_rank(),
        }

    def close(self) -> None:
        """Stop the workers (idempotent): their KV pools and graphs go with their processes."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._w.stopped

    @property
    def alive(self) -> bool:
        return not self._w.stopped


def _ids(table: Sequence[int | None]) -> list[int | None]:
    """A block table for the wire: plain ints, None where a sliding window dropped a block."""
    return [None if b is None else int(b) for b in table]


def _peek_heads(model: str | None) -> tuple[int, int] | None:
    """(query heads, KV heads) from a config.json on disk, when one is at hand without loading
    anything (a local folder, or the default model's converted cache); else None."""
    from engine.runtime.models import DEFAULT_CACHE_NAME, cache_root

    if model is None:
        return None
    folder = cache_root() / DEFAULT_CACHE_NAME if model == "default" else Path(model).expanduser()
    try:
        cfg = json.loads((folder / "config.json").read_text())
        q = int(cfg["num_attention_heads"])
        return q, int(cfg.get("num_key_value_heads") or q)
    except (OSError, ValueError, KeyError, TypeError):
        return None
