"""vLLM beside PagedLab: watch a real vLLM's prefix cache through its KV events
(`VllmWatch`, a torch-free ZMQ client), and start a local vLLM server from its own venv
(`engine.vllm.server`). The hashes: engine/core/hashing.py, where PagedLab computes vLLM's."""

from engine.vllm.schema import VllmEvent
from engine.vllm.watch import CANNOT_SHOW, VllmWatch, WatchProblem

__all__ = ["CANNOT_SHOW", "VllmEvent", "VllmWatch", "WatchProblem"]
