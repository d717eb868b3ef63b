"""One step's picks on their way from the run to the postprocess.

The run (engine/step_run.py) launches every token of a step in one batched draw and records
here which rows belong to which sequences; the postprocess (engine/core/postprocess.py) puts the
tokens into their sequences when the step lands, at once or, under async scheduling, one step
later (engine/core/in_flight.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.sequence import Sequence


@dataclass
class Launched:
    """One step's picks on their way: which rows sample which sequences, and the tokens (read
    now, or under async scheduling a handle read when the step lands)."""

    step: int
    rows: dict[int, list[tuple[Sequence, int]]]  # request id -> (sequence, row of the step)
    fresh: set[int]  # requests whose prefill this step finished: their first token
    counts: list[tuple[int, int]]  # (draws, top-k rows) per request, in rows' order
    drafts: dict[int, int] = field(default_factory=dict)  # seq id -> draft tokens to verify
    accepted: dict[int, int] = field(default_factory=dict)  # seq id -> drafts kept, decided on
    # the device (greedy rows of a step through the decode graphs); the host compares the others
    overlap: bool = False  # may land after the next step is launched
    picks: Any = None  # a device handle (pick_rows) under overlap
    tokens: list[tuple[int, float]] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
