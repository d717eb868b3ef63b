"""One tensor-parallel worker process: a shard of the model, its slice of the KV pool, a loop.

Started by engine/tp/launch.py as `python -m engine.tp.worker --rank r ...` (its own module: the
user's main module is never imported here). Rank r loads the model, keeps its Megatron shard
(engine/tp/shard.py), allocates a KV pool `[layers, 2, blocks, block_size,
kv_heads / N, head_dim]` with the same block count as every other rank, and then serves the
engine's messages (a shared-memory ring: engine/tp/shm_ring.py) until told to stop: apply the
step's copy and swap lists to its pool, run the step through the same ModelRunner a
single-process engine uses (engine/tp/worker_steps.py: decode steps from the persistent batch
the engine's diffs keep, as CUDA graphs on a GPU with the all-reduces inside), and, on rank 0,
send each row's greedy pick back. The worker keeps no bookkeeping: block ids come from the
engine, which owns the one block table.

A worker exits when the engine process dies (a watchdog thread reads the lifeline pipe whose
write end only the engine holds: end-of-file means it is gone), and reports any error it hits
under `error/{rank}` in the shared store before exiting, so the engine can name it.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import select
import shutil
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from engine.tp.comm import Reducer
from engine.tp.device_batch import GraphSpec
from engine.tp.link import ring_paths
from engine.tp.shm_ring import ShmRing, Waiter
from engine.tp.step_message import DeviceStep, decode
from engine.tp.symm_allreduce import buffer_bytes
from engine.tp.worker_steps import PendingReply, StepRunner

WORKER_TIMEOUT_S = 7 * 24 * 3600  # a worker waits for the next step as long as the engine lives
ALL_REDUCE_TIMEOUT_S = 300  # a peer that stops answering mid-step ends this worker too
SETUP_TIMEOUT_S = 30  # the symmetric-memory set-up's exchanges (the ranks met at NCCL's start)


def main(argv: list[str] | None = None) -> None:
    """`python -m engine.tp.worker`: the command line engine/tp/launch.py writes."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--store", required=True, help="the engine's FileStore")
    ap.add_argument("--config", required=True, help="the EngineConfig as a JSON file")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lifeline", type=int, default=None, help="read end of the engine's pipe")
    args = ap.parse_args(argv)
    # Ctrl-C in a terminal reaches every process of the group: the engine stops its workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(args.config) as f:
        config = json.load(f)
    worker_main(args.rank, args.size, args.store, config, args.threads, args.lifeline)


def worker_main(rank: int, size: int, store_path: str, config: dict[str, Any],
                threads: int, lifeline: int | None = None) -> None:
    """Worker `rank` of `size`; `store_path` is the engine's FileStore, `lifeline` the read end
    of a pipe that closes when the engine's process ends."""
    folder = os.path.dirname(store_path)
    if lifeline is not None:
        _exit_with_engine(lifeline, folder)
    store = dist.FileStore(store_path, size + 1)
    store.set_timeout(timedelta(seconds=WORKER_TIMEOUT_S))
    try:
        worker = _Worker(rank, size, store, config, threads, folder)
    except BaseException as err:  # noqa: BLE001 - every failure must reach the engine as text
        _report(store, rank, err)
        _exit(2 if isinstance(err, ValueError) else 1, lifeline, folder)
    try:
        worker.serve()
    except BaseException as err:  # noqa: BLE001
        _report(store, rank, err)
        _exit(1, lifeline, folder)
    os._exit(0)  # skip interpreter teardown: process groups may still hold sockets


def _exit(code: int, lifeline: int | None, folder: str) -> None:
    """End after a failure. A killed engine usually shows here first, as a broken connection,
    before the watchdog reads the end of its pipe: if the pipe ends within a second, the engine
    is gone, and nobody else will remove the store's folder."""
    if lifeline is not None and select.select([lifeline], [], [], 1.0)[0]:
        shutil.rmtree(folder, ignore_errors=True)
    os._exit(code)


def _report(store: Any, rank: int, err: BaseException) -> None:
    if not isinstance(err, ValueError):  # a bad setting is the engine's message to give
        traceback.print_exc()
    try:
        store.set(f"error/{rank}", f"{type(err).__name__}: {err}")
    except Exception:  # noqa: BLE001 - the engine is gone; nobody to tell
        pass


def _exit_with_engine(lifeline: int, folder: str) -> None:
    """End this process as soon as the engine's process ends, however it ends (and remove the
    store's folder, which a killed engine could not): the engine never writes to the pipe, so
    a read returns only at end-of-file, when its write end is closed."""

    def watch() -> None:
        while True:
            try:
                if not os.read(lifeline, 1):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)

    threading.Thread(target=watch, name="pagedlab-tp-watchdog", daemon=True).start()


class _Worker:
    def __init__(self, rank: int, size: int, store: Any, config: dict[str, Any],
                 threads: int, folder: str) -> None:
        from transformers.utils import logging as hf_logging

        from engine.config import EngineConfig
        from engine.runtime.models import load_model, resolve_device
        from engine.tp.shard import check_tp_size, shard_model

        hf_logging.disable_progress_bar()  # N bars at once help nobody (and leak tqdm's locks)
        cfg = EngineConfig.from_dict(config)
        self.rank, self.size = rank, size
        device = resolve_device(cfg.device)
        if device.type == "cuda":
            device = torch.device("cuda", rank)  # one GPU per rank
            torch.cuda.set_device(device)
            # the host's share of a step is bookkeeping on small tensors: a thread pool per rank
            # only contends with the other ranks' (the 8B prefill's metadata of 16k tokens took
            # 40 ms on worker 0 with 32 threads, against ~3 ms in one process); vLLM's workers
            # run with one thread too
            torch.set_num_threads(1)
        else:
            torch.set_num_threads(threads)  # N workers share the cores
        loaded = load_model(cfg.model, str(device), cfg.dtype)
        full = {"q_heads": loaded.num_q_heads, "kv_heads": loaded.num_kv_heads,
                "intermediate": int(loaded.config.intermediate_size)}
        check_tp_size(size, loaded.num_q_heads, loaded.num_kv_heads, cfg.model)
        reducer = Reducer(store, rank, size, device, ALL_REDUCE_TIMEOUT_S)
        _fast_all_reduce(reducer, store, cfg, loaded, rank)
        shard_model(loaded, rank, size, reducer.sum, reducer.sum_norm)
        self.cache = _pool(cfg, loaded, device, reducer, size)
        self.runner = _runner(cfg, loaded, self.cache, rank)
        self.steps = StepRunner(self.runner, rank, keep_picks=cfg.async_scheduling,
                                timing=os.environ.get("PAGEDLAB_TP_TIMING", "0") == "1")
        ctl, replies = ring_paths(folder, size)
        self.ctl, self.reply = ShmRing(ctl, rank), ShmRing(replies[rank])
        # a GPU step answers in about a millisecond: spin for the next message, don't nap
        self.wait = Waiter(spin_s=1.0 if device.type == "cuda" else 0.0, max_nap_s=0.001)
        self._pending: PendingReply | None = None  # rank 0: a reply whose picks are landing
        store.set(f"ready/{rank}", "1")
        if rank == 0:
            hello = _describe(loaded, self.cache, self.runner, full) | {
                "allreduce": reducer.describe()}
            self._answer(pickle.dumps(hello, protocol=pickle.HIGHEST_PROTOCOL))

    def serve(self) -> None:
        while True:
            raw = self._next_message()
            received = time.perf_counter()
            msg = decode(raw)
            step = isinstance(msg, DeviceStep)
            for op, pairs in (msg.cache_ops if step else msg.get("cache_ops", ())):
                getattr(self.cache, op)(pairs)  # copy_blocks / swap_out / swap_in, in order
            if step:
                self._answer(self.steps.device_step(msg, received))
                continue
            cmd = msg["cmd"]
            if cmd == "stop":
                return
            if cmd == "execute":
                self._answer(self.steps.general_step(msg["items"], msg.get("feed"), received))
            elif cmd == "logits" and self.rank == 0:  # the last step's, for a request that samples
                self._answer(self.steps.logits())
            elif cmd == "stats" and self.rank == 0:
                self._answer(pickle.dumps(self.steps.stats()))
            elif cmd == "read_block" and self.rank in msg["ranks"]:
                k, v = self.cache.read_block(msg["layer"], msg["block"])
                self._answer(torch.stack([k, v]).to(torch.float32).contiguous().numpy().tobytes())

    def _next_message(self) -> bytes:
        """The engine's next message; a reply still on its way to the host is written as soon
        as it lands, unless a message comes first (then that step is launched first)."""
        pending = self._pending
        if pending is not None:
            self.wait.until(lambda: pending.ready() or self.ctl.ready())
            if pending.ready():
                self._flush()
        return self.ctl.read(self.wait)

    def _answer(self, payload: bytes | PendingReply | None) -> None:
        """Replies go in order: one still landing is written before the next."""
        if payload is None:
            return
        self._flush()
        if isinstance(payload, PendingReply):
            self._pending = payload
        else:
            self.reply.write(payload, self.wait)

    def _flush(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.reply.write(pending.payload(), self.wait)


def _pool(cfg: Any, loaded: Any, device: torch.device, reducer: Any, size: int) -> Any:
    """This rank's slice of the KV pool; every rank must index the same block ids, so a pool
    sized from memory takes the smallest rank's count."""
    from engine.runtime.cache_engine import CacheEngine

    cache = CacheEngine(loaded, cfg.num_gpu_blocks, cfg.block_size, cfg.num_cpu_blocks,
                        device=device, dtype=loaded.dtype)
    if cfg.num_gpu_blocks is None:
        blocks = int(reducer.min(torch.tensor([cache.num_gpu_blocks], device=device)).item())
        if blocks < cache.num_gpu_blocks:
            note = f"{blocks} blocks: the smallest pool of the {size} ranks"
            del cache
            cache = CacheEngine(loaded, blocks, cfg.block_size, cfg.num_cpu_blocks,
                                device=device, dtype=loaded.dtype)
            cache.sizing_note = note
    return cache


def _graphs_on(device: torch.device) -> bool:
    return device.type == "cuda" and os.environ.get("PAGEDLAB_TP_GRAPHS", "1") != "0"


def _max_rows(cfg: Any) -> tuple[int, int]:
    """The decode buffers' batch and query length: a graph's most sequences and tokens each."""
    drafts = cfg.num_speculative_tokens if cfg.speculative_method else 0
    return min(cfg.max_num_seqs, 512), 1 + drafts


def _fast_all_reduce(reducer: Reducer, store: Any, cfg: Any, loaded: Any, rank: int) -> None:
    """The symmetric-memory all-reduce for the graphs' sums (engine/tp/symm_allreduce.py) and the
    kernel that fuses them with the norm after them (engine/tp/fused_norm.py), before any graph
    is captured; the store answers within SETUP_TIMEOUT_S meanwhile, so a
    rank that fails half-way cannot leave the others waiting for a week."""
    batch, query = _max_rows(cfg)
    nbytes = buffer_bytes(batch * query, int(loaded.config.hidden_size), loaded.dtype)
    store.set_timeout(timedelta(seconds=SETUP_TIMEOUT_S))
    try:
        reducer.use_symmetric_memory(store, nbytes, loaded.dtype, _graphs_on(reducer.device),
                                     _log if rank == 0 else None)
        reducer.use_fused_norm(store, batch * query, int(loaded.config.hidden_size), loaded.dtype,
                               _graphs_on(reducer.device), _log if rank == 0 else None)
    finally:
        store.set_timeout(timedelta(seconds=WORKER_TIMEOUT_S))


def _runner(cfg: Any, loaded: Any, cache: Any, rank: int) -> Any:
    """The shard's ModelRunner. On a GPU its decode and verification steps are CUDA graphs with
    the all-reduces captured inside them (symmetric memory or NCCL: both support capture; every
    rank captures the same graphs in the same order, so the collectives inside them pair up),
    captured at start like a one-process engine's. PAGEDLAB_TP_GRAPHS=0 keeps them eager (the
    bench's comparison); PAGEDLAB_TP_STATIC_QUERIES=1 has a CPU run drafts and short prompt
    rests from the decode buffers too, padded, as a GPU does (the tests' way to that path
    without a GPU)."""
    from engine.runtime.collector import settle_heap
    from engine.runtime.model_runner import ModelRunner

    graphs = _graphs_on(cache.device)
    static = os.environ.get("PAGEDLAB_TP_STATIC_QUERIES", "0") == "1"
    batch, query = _max_rows(cfg)
    runner = ModelRunner(loaded, cache, max_batch=batch, use_graphs=graphs, max_query=query,
                         static_queries=static)
    runner.warm_up_seconds = 0.0
    if graphs and os.environ.get("PAGEDLAB_WARMUP", "1") != "0":
        runner.warm_up_seconds = runner.warm_up(_log if rank == 0 else None)
        settle_heap()  # as a one-process engine after its warm-up: engine/runtime/collector.py
    return runner


def _log(line: str) -> None:
    print(line.replace("[pagedlab]", "[pagedlab tp rank 0]"), file=sys.stderr, flush=True)


def _describe(loaded: Any, cache: Any, runner: Any, full: dict[str, int]) -> dict[str, Any]:
    """What the engine process needs to know about the model (it loads none of it itself)."""
    from engine.runtime.attention_window import layer_windows

    cfg = loaded.config
    return {
        "name": loaded.name, "source": loaded.source, "device": str(loaded.device),
        "dtype": str(loaded.dtype).replace("torch.", ""), "layers": loaded.num_layers,
        "q_heads": full["q_heads"], "kv_heads": full["kv_heads"], "head_dim": loaded.head_dim,
        "hidden": int(cfg.hidden_size), "intermediate": full["intermediate"],
        "vocab": loaded.vocab_size, "logits_dim": int(runner.lm_head.weight.shape[0]),
        "max_positions": loaded.max_position_embeddings, "eos": list(loaded.eos_token_ids),
        "layer_windows": layer_windows(cfg),
        "tokenizer": loaded.tokenizer, "num_gpu_blocks": cache.num_gpu_blocks,
        "sizing": cache.sizing_note, "kernel": cache.ops.name,
        "layer_path": ("lean decoder (fused layer kernels)" if runner.lean is not None
                       else "the model's own modules"),
        "kv_bytes_per_token_rank": cache.kv_bytes_per_token,
        "bytes_per_block_rank": cache.bytes_per_block,
        "weight_bytes_rank": sum(p.numel() * p.element_size()
                                 for p in loaded.model.parameters()),
        "load_seconds": loaded.load_seconds, "warm_up_seconds": runner.warm_up_seconds,
        "graphs": GraphSpec.of(runner),
        # what this rank's GPU holds once weights and pool are in (None on a CPU)
        "device_bytes_allocated": (torch.cuda.memory_allocated(loaded.device)
                                   if loaded.device.type == "cuda" else None),
    }


if __name__ == "__main__":
    main()
