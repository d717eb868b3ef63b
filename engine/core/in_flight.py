"""Async scheduling's one place: the step whose picked tokens are still on the device.

With `EngineConfig(async_scheduling=True)` step t + 1 is scheduled and launched before step t's
tokens are read back (they land while t + 1 computes). `InFlight` owns that step: whether the
next step may overlap it, landing it (through the postprocess) at the right moment, and what
landed outside a step (before a primitive op) for the next step to report. Without async
scheduling nothing stays in flight and every step lands at once.
"""

from __future__ import annotations

from typing import Any

from engine.core.events import Event
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.launched import Launched
from engine.core.outputs import RequestOutput
from engine.core.postprocess import Postprocessor
from engine.core.scheduler import Scheduler


class InFlight:
    # declared state (engine/core/state.py): a checkpoint is taken only with nothing in flight,
    # so what it keeps are the reports for the next step (events and outputs: immutable values)
    STATE = ("launched", "last_picks", "_events", "_finished")
    FIXED = ("post", "scheduler", "kv")

    def __init__(self, post: Postprocessor, scheduler: Scheduler, kv: KVCacheManager) -> None:
        self.post = post
        self.scheduler = scheduler
        self.kv = kv
        self.launched: Launched | None = None  # the step still on the device, if any
        self.last_picks: Any = None  # its picks: the next step's inputs read its tokens there
        # what landed outside a step (before a primitive op): the next step reports it
        self._events: list[Event] = []
        self._finished: list[RequestOutput] = []

    def state(self) -> tuple:
        if self.launched is not None:
            raise ValueError("a step is in flight: land it (any primitive operation does) first")
        return tuple(self._events), tuple(self._finished)

    def load_state(self, state: tuple) -> None:
        """Back to `state`: nothing in flight (the picks of a step after it are gone)."""
        events, finished = state
        self.launched, self.last_picks = None, None
        self._events, self._finished = list(events), list(finished)

    def settle(self) -> None:
        """Before a primitive op, which works on settled sequences: the step on its way lands
        now (its events and finished requests are reported by the next step)."""
        if self.launched is not None:
            launched, self.launched = self.launched, None
            self._finished += self.post.land(launched, self._events)

    def report_later(self, finished: RequestOutput) -> None:
        """A request that ended outside a step (a primitive freed its last sequence): the next
        step reports it among its finished requests."""
        self._finished.append(finished)

    def before_step(self) -> tuple[list[Event], list[RequestOutput]]:
        """A step begins: what landed since the last one, plus the step in flight landed now
        unless the next step may be scheduled before its tokens are read."""
        events, self._events = self._events, []
        finished, self._finished = self._finished, []
        if self.launched is not None and not self._can_overlap(self.launched):
            finished += self.post.land(self.launched, events)  # the last step's tokens, first
            self.launched = None
        return events, finished

    def after_launch(self, launched: Launched | None, events: list[Event]) -> list[RequestOutput]:
        """This step's picks are launched: the step before lands (it computed meanwhile); this
        one stays in flight if it may overlap the next, else it lands now."""
        finished = []
        if self.launched is not None:
            finished += self.post.land(self.launched, events)
            self.launched = None
        if launched is not None and launched.overlap:
            self.launched, self.last_picks = launched, launched.picks
        elif launched is not None:
            finished += self.post.land(launched, events)
        return finished

    def _can_overlap(self, inflight: Launched) -> bool:
        """May the next step be scheduled before `inflight`'s tokens are read? Not when they
        decide forks and frees (beams, the n samples of a prefill), and not when the next step
        could preempt: a preempted sequence must not have a token on its way. A decode takes
        at most one block a sequence in each KV cache group (a new one or a copy-on-write), so
        enough free blocks for all of them rule that out."""
        sched = self.scheduler
        if not inflight.overlap or sched.swapped:
            return False
        free = self.kv.pool.num_allocatable
        if free >= sched.num_running_seqs * self.kv.num_groups:
            return True
        # a fuller pool: count what the next decode pass takes (one pass over the sequences)
        needed = self.kv.blocks_needed_to_append
        return sum(needed(s, 1) for g in sched.running for s in g.live()) <= free
