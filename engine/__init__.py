"""The PagedLab engine: paged KV-cache bookkeeping (torch-free) and the runtime that fills it."""

from engine.block_pool import OutOfBlocks
from engine.config import EngineConfig
from engine.events import Event
from engine.kv_cache_manager import InvariantError
from engine.llm_engine import LLMEngine
from engine.sequence import SamplingParams

__all__ = ["EngineConfig", "Event", "InvariantError", "LLMEngine", "OutOfBlocks", "SamplingParams"]
