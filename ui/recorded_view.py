"""What the page draws at one point of a session's log, recorded when the engine was there
(ui/session.py keeps one per position; Back, Next and the timeline draw them with no engine
work): the engine's snapshot and events, its requests, the run so far as a request timeline,
and, after a serving step, that step's memory point (engine/describe/memory_use.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine import LLMEngine
from engine.describe.memory_use import MemoryPoint, memory_point


@dataclass(frozen=True)
class View:
    snapshot: Any
    events: tuple
    requests: tuple
    finished: tuple
    info: dict[str, Any]
    max_model_len: int
    timeline: Any = None  # engine RequestTimeline: every serving step up to here
    memory: MemoryPoint | None = None  # the blocks by state, if this point is a serving step

    @classmethod
    def of(cls, eng: LLMEngine) -> View:
        snap, events = eng.snapshot(), tuple(eng.last_events)
        last = eng.last_step
        stepped = last is not None and last.step == eng.current_step()
        return cls(snap, events, tuple(eng.requests()), tuple(eng.finished_requests()),
                   eng.engine_info(), eng.max_model_len, eng.request_timeline(),
                   memory_point(snap, events) if stepped else None)
