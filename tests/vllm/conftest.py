"""One real vLLM server for every test of this folder (its start dominates: about 90 s here).

The server runs vLLM's CPU build from .venv-vllm (scripts/setup_vllm.sh; or PAGEDLAB_VLLM_PYTHON)
on PagedLab's default model folder, in float32, at block size 32 (vLLM's CPU attention takes
multiples of 32 only), with a small pool (so a repeat can find its blocks evicted) and a small
token budget per step (so a long prompt goes in chunks), KV events on. Without vLLM the tests
skip and say why. The server starts as soon as the folder's first test asks for it and runs
while the tests that need no answer from it yet (the hash check) go on.

PagedLab's side runs on one torch thread here: on a 2-core machine where vLLM's engine holds a
core, its CPU runtime with two intra-op threads spent most of its time waiting at the threads'
barriers (the chat workload took 39-119 s with two threads and 7-8 s with one, at load 5-8).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from engine.vllm import lab
from engine.vllm.ask import settle as settle_events
from engine.vllm.server import ServerConfig, VllmServer, VllmUnavailable
from engine.vllm.watch import VllmWatch

#: what both engines run: PagedLab's EngineConfig takes the same numbers (see engine_config)
BLOCK_SIZE = 32
POOL_BLOCKS = 24  # vLLM's num_gpu_blocks_override; its block 0 is a null block: 23 hold tokens
BUDGET = 64  # max_num_batched_tokens
SERVER = ServerConfig(block_size=BLOCK_SIZE, num_gpu_blocks=POOL_BLOCKS, max_model_len=512,
                      max_num_batched_tokens=BUDGET, max_lifetime_s=3600)


@pytest.fixture(scope="package")
def vllm_boot(default_model) -> Iterator[VllmServer]:
    """The server, started (not yet answering). The default model is loaded first: its loading
    makes the converted folder vLLM serves."""
    try:
        server = VllmServer(SERVER)
    except VllmUnavailable as err:
        pytest.skip(str(err))
    yield server
    os.environ.pop(lab.ENV, None)
    server.close()


@pytest.fixture(scope="package")
def vllm_server(vllm_boot: VllmServer) -> VllmServer:
    """The server once it answers (its start time is in `ready_after`)."""
    vllm_boot.wait_ready(timeout_s=600)
    # from now on the lab's vLLM (engine/vllm/lab.py) is this one, here and in any app process a
    # test starts: "Start one here", a room served by vLLM and lesson 15 adopt it, none starts
    # another (vLLM's start dominates what it adds to the suite)
    os.environ[lab.ENV] = json.dumps({"url": vllm_boot.url, "events": vllm_boot.events_endpoint,
                                      "replay": vllm_boot.replay_endpoint,
                                      "model": vllm_boot.config.model, "local": True})
    return vllm_boot


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def vllm_watch(vllm_server: VllmServer) -> Iterator[VllmWatch]:
    """A new watch on the server's KV events (vLLM binds them on an ipc:// socket of this user's;
    any number of watches connect). It joins late: its first message is not vLLM's first, so it
    replays the rest from vLLM's replay endpoint and so knows the cache as it is."""
    with VllmWatch(vllm_server.events_endpoint, vllm_server.replay_endpoint,
                   silence_s=300) as w:
        yield w


def settle(watch: VllmWatch, quiet_s: float = 0.4, most_s: float = 10.0) -> list:
    """Every event until none came for `quiet_s` (vLLM publishes a step's events just after the
    step, so an HTTP answer can come before its last events), then what the replay endpoint
    still holds after the last one taken (a message the PUB dropped while a subscription was on
    its way)."""
    return settle_events(watch, quiet_s, most_s) + watch.catch_up()
