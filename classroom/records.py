"""What a room remembers of each student's request, and the published, read-only view of a room.

The engine forgets a request once it finishes; a class wants to see it (its text, how long it
waited, whether it was preempted), so the room keeps one `RoomRequest` per request. After every
change the room publishes a `RoomView`: plain data (a JSON-ready state, the engine's immutable
snapshot, the last step's events, row labels for the picture) that pages and the API read without
taking the engine's lock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.core.events import Event
from engine.describe.snapshot import Snapshot

STATUSES = ("waiting", "running", "preempted", "done")


@dataclass
class RoomRequest:
    request_id: int  # the room's id: unique in the room, across clears
    student: str  # the label the projector shows
    prompt: str
    prompt_tokens: int  # with the system prompt and chat template: what the engine holds
    submitted: float  # time.monotonic()
    status: str = "waiting"
    text: str = ""
    blocks: tuple[int, ...] = ()  # physical GPU blocks its sequences hold now
    preemptions: int = 0
    swapped: bool = False  # preempted to CPU swap space (else: will recompute)
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None

    def public(self) -> dict[str, Any]:
        def since(t: float | None) -> float | None:
            return None if t is None else round(t - self.submitted, 3)

        return {"id": self.request_id, "student": self.student, "prompt": self.prompt,
                "status": self.status, "text": self.text, "blocks": list(self.blocks),
                "preemptions": self.preemptions, "swapped": self.swapped,
                "finish_reason": self.finish_reason, "time_to_first_token_s": since(self.first_token_at),
                "time_to_finish_s": since(self.finished_at)}


@dataclass(frozen=True)
class RoomView:
    """One published state of a room. `state` is what `/room_state` returns."""

    state: Mapping[str, Any]
    snapshot: Snapshot | None = None
    events: tuple[Event, ...] = ()
    seq_labels: Mapping[int, str] = field(default_factory=dict)  # seq id -> "Ana · request 3"
    decode: Callable[[list[int]], str] | None = None
    reserved: frozenset[int] = frozenset()  # blocks the teacher holds back (Shrink pool)
    # the run over time and the prefix tree, for the views under the projector's picture
    timeline: Any = None  # engine RequestTimeline since the last clear
    memory: tuple = ()  # engine MemoryPoint of every step since the last clear (the last MAX_POINTS)
    tree: Any = None  # engine PrefixTree of `snapshot`
    names: Mapping[int, str] = field(default_factory=dict)  # engine request id -> "Ana #3"

