"""A local vLLM OpenAI server with KV events on, started from vLLM's own venv, on loopback only.

vLLM pins torch and transformers apart from PagedLab, so it lives in its own venv
(`scripts/setup_vllm.sh` makes `.venv-vllm`); a GPU box points PagedLab at its own vLLM with
PAGEDLAB_VLLM_PYTHON=/path/to/python. `vllm_python()` finds it, or says why there is none.

The server (`python -m vllm.entrypoints.openai.api_server`: the `vllm` command looks for a
package named "vllm", which the CPU build is not) serves PagedLab's default model folder as it
is, at PagedLab's block size, in float32, greedy unless asked, with the prefix cache, its KV
events published at `events_endpoint` and replayed from `replay_endpoint`. vLLM binds both: the
events on an ipc:// socket in a folder of this user's (vLLM binds ipc and `*` endpoints and
connects to the rest, and `*` would listen beyond loopback), the replay on 127.0.0.1; so any
number of watches (a browser session each, a room, a lesson, a test) connect to one server. It
stops by itself: its process group ends with `close()`, when this process dies (a parent-death
signal) and after `max_lifetime_s`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.runtime.model_files import DEFAULT_CACHE_NAME, cache_root
from engine.vllm.openai_client import OpenAIClient

#: a log line that may name why vLLM stopped (the lines a failed start ends with do not)
_CAUSE = re.compile(r"Error|Exception|Killed|out of memory|OOM")

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
FAILED_MARK = REPO / ".venv-vllm" / ".pagedlab-vllm-failed"


class VllmUnavailable(RuntimeError):
    """No vLLM to run here; the message says why and what to do."""


def vllm_python() -> str:
    """The python that has vLLM: $PAGEDLAB_VLLM_PYTHON, else .venv-vllm's; else VllmUnavailable."""
    given = os.environ.get("PAGEDLAB_VLLM_PYTHON")
    if given:
        if not os.access(given, os.X_OK):
            raise VllmUnavailable(f"PAGEDLAB_VLLM_PYTHON={given} is not an executable python")
        return given
    if FAILED_MARK.exists():
        raise VllmUnavailable("vLLM could not be installed by scripts/setup_vllm.sh: "
                              + FAILED_MARK.read_text().strip())
    if not VENV_PYTHON.exists() or not (VENV_PYTHON.parent.parent / ".pagedlab-vllm-setup").exists():
        raise VllmUnavailable("vLLM is not installed here: run `bash scripts/setup_vllm.sh` (the "
                              "README's test command does), or set PAGEDLAB_VLLM_PYTHON to a "
                              "python that has vllm")
    return str(VENV_PYTHON)


def default_model_folder() -> Path:
    """PagedLab's converted default model (SmolLM2-135M-Instruct), made when PagedLab first loads
    it (engine/runtime/models.py); vLLM loads the folder as it is."""
    return cache_root() / DEFAULT_CACHE_NAME


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class ServerConfig:
    """What the server runs: PagedLab's settings that vLLM must share for the same cache."""

    model: str = field(default_factory=lambda: str(default_model_folder()))
    block_size: int = 32  # vLLM's CPU attention takes multiples of 32 only
    num_gpu_blocks: int | None = None  # vLLM's num_gpu_blocks_override (block 0 is its null block)
    max_model_len: int = 1024
    max_num_batched_tokens: int | None = None  # a small one makes long prompts go in chunks
    hash_algo: str = "sha256"
    hash_seed: str | None = None  # vLLM's PYTHONHASHSEED
    # --kv-cache-memory-bytes: the KV cache's size, given outright. vLLM's CPU build otherwise
    # takes a fraction of the memory node's total less what the worker already holds, and a
    # machine whose node reported 11.7 of its 23 GiB left a negative size for it at 0.1
    kv_cache_bytes: int = 1 << 30
    max_lifetime_s: float | None = 1800.0


class VllmServer:
    """One vLLM OpenAI server process (and its engine processes) on 127.0.0.1."""

    def __init__(self, config: ServerConfig | None = None, log_path: str | None = None) -> None:
        self.config = config = config or ServerConfig()
        self.python = vllm_python()
        if config.model.startswith(("/", ".", "~")) and not Path(config.model).expanduser().is_dir():
            raise VllmUnavailable(f"no model at {config.model}: load PagedLab's default model once "
                                  f"(it converts the weights there), or give a folder")
        self.port, replay = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = OpenAIClient(self.url, config.model)
        self._folder = tempfile.mkdtemp(prefix="pagedlab-vllm-")  # mode 0700: this user's only
        self.events_endpoint = f"ipc://{self._folder}/kv-events"
        self.replay_endpoint = f"tcp://127.0.0.1:{replay}"
        self.log_path = log_path or tempfile.mkstemp(prefix="pagedlab-vllm-", suffix=".log")[1]
        self.started = time.monotonic()
        self.ready_after: float | None = None
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self._argv(), env=self._env(), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=_die_with_parent)

    def _argv(self) -> list[str]:
        c = self.config
        kv_events = {"enable_kv_cache_events": True, "publisher": "zmq",
                     "endpoint": self.events_endpoint, "replay_endpoint": self.replay_endpoint}
        argv = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", c.model,
                "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager",
                "--dtype", "float32", "--block-size", str(c.block_size), "--enable-prefix-caching",
                "--prefix-caching-hash-algo", c.hash_algo, "--max-model-len", str(c.max_model_len),
                "--kv-cache-memory-bytes", str(c.kv_cache_bytes),
                "--generation-config", "vllm",  # PagedLab's defaults, not the model folder's
                "--enable-prompt-tokens-details",  # usage reports num_cached_tokens
                "--kv-events-config", json.dumps(kv_events), "--uvicorn-log-level", "warning"]
        if c.num_gpu_blocks is not None:
            argv += ["--num-gpu-blocks-override", str(c.num_gpu_blocks)]
        if c.max_num_batched_tokens is not None:
            argv += ["--max-num-batched-tokens", str(c.max_num_batched_tokens)]
        if c.max_lifetime_s is not None and Path("/usr/bin/timeout").exists():
            argv = ["/usr/bin/timeout", "-k", "10", str(int(c.max_lifetime_s))] + argv
        return argv

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1"}
        env.pop("PYTHONHASHSEED", None)
        if self.config.hash_seed is not None:
            env["PYTHONHASHSEED"] = self.config.hash_seed
        return env

    # ---- life ---------------------------------------------------------------------------------

    def wait_ready(self, timeout_s: float = 600.0) -> float:
        """Wait until the server answers; the seconds from start. A RuntimeError with the log's
        tail if it exits or does not answer in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited at start (code {self.proc.returncode}):\n"
                                   f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.ready_after = time.monotonic() - self.started
                        return self.ready_after
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        self.close()
        raise RuntimeError(f"vLLM did not answer in {timeout_s:g} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        with open(self.log_path, errors="replace") as f:
            return log_excerpt(f.readlines(), lines)

    def close(self) -> None:
        """Stop the server and the processes it started (its process group)."""
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:  # its engine core and workers share the group; none may outlive it
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the OpenAI API (engine/vllm/openai_client.py) ------------------------------------------

    def post(self, path: str, body: dict[str, Any] | None = None, timeout_s: float = 300) -> Any:
        return self.client.request(path, body if body is not None else {}, timeout_s=timeout_s)

    def complete(self, prompt_ids: list[int], max_tokens: int, **sampling: Any) -> dict[str, Any]:
        """One completion of a prompt given as token ids (greedy unless `sampling` says else):
        {"outputs": [token ids of each of the n], "cached_tokens": vLLM's num_cached_tokens}."""
        return self.client.complete(prompt_ids, max_tokens, **sampling)

    def reset_prefix_cache(self) -> None:
        """Empty vLLM's prefix cache (it publishes AllBlocksCleared)."""
        self.client.reset_prefix_cache()


def _die_with_parent() -> None:
    """In the child: SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def log_excerpt(text: list[str], lines: int = 30) -> str:
    """A log's last `lines` lines, after the error lines before them: a failed start of vLLM
    ends with "Engine core initialization failed. See root cause above", the cause far above."""
    causes = [line for line in text[:-lines] if _CAUSE.search(line)][-12:]
    return "".join(causes + ["...\n"] if causes else []) + "".join(text[-lines:])
