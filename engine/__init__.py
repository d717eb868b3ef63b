"""The PagedLab engine: paged KV-cache bookkeeping (torch-free) and the runtime that fills it."""

from engine.config import EngineConfig
from engine.core.block_pool import OutOfBlocks
from engine.core.events import Event
from engine.core.kv_cache_manager import InvariantError
from engine.core.sequence import SamplingParams
from engine.llm_engine import LLMEngine

__all__ = ["EngineConfig", "Event", "InvariantError", "LLMEngine", "OutOfBlocks", "SamplingParams",
           "VllmWatch"]


def __getattr__(name: str) -> object:
    """`from engine import VllmWatch` loads the ZMQ client only when asked for (engine.vllm)."""
    if name == "VllmWatch":
        from engine.vllm.watch import VllmWatch

        return VllmWatch
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
