"""What a page draws at one position of a run's log, recorded when the engine was there: the
engine's snapshot and the last operation's events, its requests and finished outputs, its
description, the run so far as a request timeline, and, after a serving step, that step's memory
point. Back, Next and the timeline draw frames with no engine work (history/run_history.py keeps
one per position it was asked to record)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine import LLMEngine
from engine.describe.memory_use import MemoryPoint, memory_point


@dataclass(frozen=True)
class Frame:
    snapshot: Any  # engine Snapshot
    events: tuple  # the last operation's events
    requests: tuple  # engine RequestState of every unfinished request, in queue order
    finished: tuple  # every finished request's output so far
    info: dict[str, Any]  # engine_info()
    max_model_len: int
    timeline: Any = None  # engine RequestTimeline: every serving step up to here
    memory: MemoryPoint | None = None  # the blocks by state, if this point is a serving step

    @classmethod
    def of(cls, eng: LLMEngine) -> Frame:
        snap, events = eng.snapshot(), tuple(eng.last_events)
        last = eng.last_step
        stepped = last is not None and last.step == eng.current_step()
        return cls(snap, events, tuple(eng.requests()), tuple(eng.finished_requests()),
                   eng.engine_info(), eng.max_model_len, eng.request_timeline(),
                   memory_point(snap, events) if stepped else None)
