"""One tensor-parallel worker process: a shard of the model, its slice of the KV pool, a loop.

Started by engine/tp/launch.py as `python -m engine.tp.worker --rank r ...` (its own module: the
user's main module is never imported here). Rank r loads the model, keeps its Megatron shard
(engine/tp/shard.py), allocates a KV pool `[layers, 2, blocks, block_size,
kv_heads / N, head_dim]` with the same block count as every other rank, and then serves the
engine's messages until told to stop: apply the step's copy and swap lists to its pool, run the
step's tokens through the same ModelRunner a single-process engine uses (the all-reduces happen
inside), and, on rank 0, send the logits back. The worker keeps no bookkeeping: block ids come
from the engine, which owns the one block table.

A worker exits when the engine process dies (a watchdog thread reads the lifeline pipe whose
write end only the engine holds: end-of-file means it is gone), and reports any error it hits
under `error/{rank}` in the shared store before exiting, so the engine can name it.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import threading
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from engine.runtime.protocols import StepItem
from engine.tp.comm import broadcast_object, gloo_group

WORKER_TIMEOUT_S = 7 * 24 * 3600  # a worker waits for the next step as long as the engine lives
ALL_REDUCE_TIMEOUT_S = 300  # a peer that stops answering mid-step ends this worker too


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
        worker = _Worker(rank, size, store, config, threads)
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
                 threads: int) -> None:
        from transformers.utils import logging as hf_logging

        from engine.config import EngineConfig
        from engine.runtime.cache_engine import CacheEngine
        from engine.runtime.model_runner import ModelRunner
        from engine.runtime.models import load_model, resolve_device
        from engine.tp.shard import check_tp_size, shard_model

        hf_logging.disable_progress_bar()  # N bars at once help nobody (and leak tqdm's locks)
        cfg = EngineConfig.from_dict(config)
        self.rank, self.size = rank, size
        device = resolve_device(cfg.device)
        if device.type == "cuda":
            device = torch.device("cuda", rank)  # one GPU per rank
            torch.cuda.set_device(device)
        else:
            torch.set_num_threads(threads)  # N workers share the cores
        loaded = load_model(cfg.model, str(device), cfg.dtype)
        full = {"q_heads": loaded.num_q_heads, "kv_heads": loaded.num_kv_heads,
                "intermediate": int(loaded.config.intermediate_size)}
        check_tp_size(size, loaded.num_q_heads, loaded.num_kv_heads, cfg.model)
        reducer = _Reducer(store, rank, size, device)
        shard_model(loaded, rank, size, reducer.sum)
        cache = CacheEngine(loaded, cfg.num_gpu_blocks, cfg.block_size, cfg.num_cpu_blocks,
                            device=device, dtype=loaded.dtype)
        if cfg.num_gpu_blocks is None:  # every rank must index the same block ids: the smallest
            blocks = reducer.min(torch.tensor([cache.num_gpu_blocks], device=device))
            if int(blocks.item()) < cache.num_gpu_blocks:
                note = f"{int(blocks.item())} blocks: the smallest pool of the {size} ranks"
                del cache
                cache = CacheEngine(loaded, int(blocks.item()), cfg.block_size,
                                    cfg.num_cpu_blocks, device=device, dtype=loaded.dtype)
                cache.sizing_note = note
        # CUDA graphs stay off: an all-reduce inside a captured graph needs NCCL's graph
        # support set up per communicator, which this lab does not do.
        self.runner = ModelRunner(loaded, cache, max_batch=min(cfg.max_num_seqs, 256),
                                  use_graphs=False)
        self.cache = cache
        store.set(f"ready/{rank}", "1")
        self.ctl = gloo_group(store, "ctl", rank + 1, size + 1, WORKER_TIMEOUT_S)
        self.reply = gloo_group(store, f"reply{rank}", 1, 2, WORKER_TIMEOUT_S)
        if rank == 0:
            broadcast_object(self.reply, _describe(loaded, cache, self.runner, full), 1, 1)

    def serve(self) -> None:
        while True:
            msg, _ = broadcast_object(self.ctl, None, 0, self.rank + 1)
            for op, pairs in msg.get("cache_ops", ()):
                getattr(self.cache, op)(pairs)  # copy_blocks / swap_out / swap_in, in order
            cmd = msg["cmd"]
            if cmd == "stop":
                return
            if cmd == "execute":
                self._execute(msg["items"])
            elif cmd == "logits" and self.rank == 0:  # the last step's, for a request that samples
                logits = self.last.logits[: self.last_rows].to("cpu", torch.float32).contiguous()
                self.reply.broadcast(logits, 1).wait()
            elif cmd == "read_block" and self.rank in msg["ranks"]:
                k, v = self.cache.read_block(msg["layer"], msg["block"])
                self.reply.broadcast(torch.stack([k, v]).contiguous(), 1).wait()

    def _execute(self, items: list[StepItem]) -> None:
        scores = self.runner.execute_scores(items)
        if self.rank == 0:
            # The greedy pick of every row is all most steps need: 16 bytes a row instead of the
            # vocabulary's logits; those stay here until the engine asks ("logits").
            rows = sum(it.num_logits for it in items)
            self.last, self.last_rows = scores, rows
            picks = torch.tensor([scores.greedy(i) for i in range(rows)], dtype=torch.float64)
            self.reply.broadcast(picks, 1).wait()


class _Reducer:
    """The workers' all-reduce: NCCL between GPUs (the process's default group, one GPU per
    rank), else a gloo group on the loopback interface."""

    def __init__(self, store: Any, rank: int, size: int, device: torch.device) -> None:
        self.nccl = device.type == "cuda"
        if self.nccl:
            dist.init_process_group("nccl", store=dist.PrefixStore("tp", store), rank=rank,
                                    world_size=size, device_id=device,
                                    timeout=timedelta(seconds=ALL_REDUCE_TIMEOUT_S))
        else:
            self.group = gloo_group(store, "tp", rank, size, ALL_REDUCE_TIMEOUT_S)

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return self._reduce(t, dist.ReduceOp.SUM)

    def min(self, t: torch.Tensor) -> torch.Tensor:
        return self._reduce(t, dist.ReduceOp.MIN)

    def _reduce(self, t: torch.Tensor, op: Any) -> torch.Tensor:
        if self.nccl:
            dist.all_reduce(t, op=op)
        else:
            options = dist.AllreduceOptions()
            options.reduceOp = op
            self.group.allreduce([t], options).wait()
        return t


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
        "load_seconds": loaded.load_seconds,
        # what this rank's GPU holds once weights and pool are in (None on a CPU)
        "device_bytes_allocated": (torch.cuda.memory_allocated(loaded.device)
                                   if loaded.device.type == "cuda" else None),
    }


if __name__ == "__main__":
    main()
