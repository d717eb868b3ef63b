"""Starting and stopping the tensor-parallel workers: each is `python -m engine.tp.worker`.

Why not multiprocessing: its "spawn" and "forkserver" start methods run the user's main module
again in every worker, so a plain script that builds a tensor-parallel engine at top level (no
`if __name__ == "__main__":`) failed; "fork" would copy this process's threads half-locked. A
worker started as its own module imports only the engine. What it needs comes on its command
line: its rank, the world size, the private folder holding the rendezvous store (a FileStore,
no port) and the config (a JSON file beside it), and the file descriptor of a pipe.

The pipe is how a worker knows that the engine's process is gone, however it ended: the engine
holds the only write end, so when its process dies the worker's read returns end-of-file, and
the worker removes the private folder and exits. `stop_workers` asks them to stop (when they are
healthy), kills what is left and reaps every process: no orphans, no zombies.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STOP_TIMEOUT_S = 5.0  # how long close() lets workers exit on their own before killing them
# NVLink multicast stays off in every worker, whatever the caller's environment says: a program
# that uses it can put a shared host's GPUs out of service (the lab machines require these)
SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1",
                 # symmetric memory (engine/tp/symm_allreduce.py) on PyTorch's own peer-to-peer
                 # backend, the one whose multicast the variable above turns off
                 "TORCH_SYMMMEM": "CUDA"}


class WorkerProcess:
    """One worker's process, with the few questions the engine asks of it."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        self.pid = popen.pid

    @property
    def exitcode(self) -> int | None:
        """None while it runs; its exit status, or -signal when a signal ended it."""
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float) -> None:
        try:
            self.popen.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.is_alive():
            self.popen.kill()  # SIGKILL also ends a stopped (SIGSTOP) or hung process


@dataclass
class Workers:
    """The processes, the store and the groups; what a finalizer needs to stop them (it must
    not hold the runtime, or a dropped engine would never be collected)."""

    procs: list[WorkerProcess]
    store: Any
    folder: str
    lifeline: int | None = None  # the pipe's write end: closing it tells the workers to go
    ctl: Any = None  # engine/tp/shm_ring.ShmRing: the engine's messages to every worker
    replies: list[Any] = field(default_factory=list)  # each worker's ring back
    stopped: bool = False


def start_workers(size: int, folder: str, store_path: str, config: dict[str, Any],
                  threads: int) -> tuple[list[WorkerProcess], int]:
    """Start `size` workers; returns them and the write end of their lifeline pipe."""
    config_path = os.path.join(folder, "config.json")
    Path(config_path).write_text(json.dumps(config))
    read_end, write_end = os.pipe()  # neither end is inherited unless passed (PEP 446)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds `engine`
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.update(SAFE_NCCL_ENV)
    procs: list[WorkerProcess] = []
    try:
        for rank in range(size):
            cmd = [sys.executable, "-m", "engine.tp.worker", "--rank", str(rank),
                   "--size", str(size), "--store", store_path, "--config", config_path,
                   "--threads", str(threads), "--lifeline", str(read_end)]
            procs.append(WorkerProcess(subprocess.Popen(
                cmd, env=env, pass_fds=(read_end,), stdin=subprocess.DEVNULL)))
    except BaseException:
        os.close(write_end)
        for p in procs:
            p.kill()
            p.join(STOP_TIMEOUT_S)
        raise
    finally:
        os.close(read_end)  # the workers hold their copies
    return procs, write_end


def stop_workers(w: Workers, polite: bool) -> None:
    """End every worker: ask them to stop (when they are healthy), then kill what is left."""
    if w.stopped:
        return
    w.stopped = True
    if polite and w.ctl is not None and all(p.is_alive() for p in w.procs):
        from engine.tp.shm_ring import Waiter
        from engine.tp.step_message import encode_object

        deadline = time.monotonic() + STOP_TIMEOUT_S

        def give_up() -> None:  # a full ring nobody reads: kill below
            if time.monotonic() > deadline:
                raise TimeoutError("the workers did not take the stop message")

        try:
            w.ctl.write(encode_object({"cmd": "stop"}), Waiter(0.0, 0.001, give_up))
        except Exception:  # noqa: BLE001 - a worker already gone: kill below
            pass
    deadline = time.monotonic() + (STOP_TIMEOUT_S if polite else 0)
    for p in w.procs:
        p.join(deadline - time.monotonic())
    for p in w.procs:
        p.kill()
    for p in w.procs:
        p.join(STOP_TIMEOUT_S)  # reaped: no zombie left behind
    if w.lifeline is not None:
        os.close(w.lifeline)
        w.lifeline = None
    for ring in [w.ctl, *w.replies]:
        if ring is not None:
            ring.close()
    w.ctl, w.replies = None, []
    shutil.rmtree(w.folder, ignore_errors=True)
