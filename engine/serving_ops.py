"""Serving's operations: `add_request` queues a request, `step` runs one scheduler iteration.

The serving half of the engine's dispatch (the lessons' half is `engine/primitive_ops.py`):
`Serving` is a part of LLMEngine that holds the engine's parts these need, never the engine
itself. A step reads as nano-vllm's: **schedule** (engine/core/scheduler.py decides decodes,
prefills and preemptions, and moves the blocks), **run** (engine/step_run.py: copies, one forward
pass, the step's picks), **postprocess** (engine/core/postprocess.py: tokens into sequences,
beams' fork / free, finished requests). Under async scheduling the picks may land one step later:
engine/core/in_flight.py owns the step in flight.
"""

from __future__ import annotations

from engine import ops, step_run
from engine.config import EngineConfig
from engine.core.events import Event
from engine.core.in_flight import InFlight
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.kv_content import KVContent
from engine.core.launched import Launched
from engine.core.outputs import StepResult
from engine.core.postprocess import Postprocessor
from engine.core.registry import Registry
from engine.core.scheduler import ScheduledStep, Scheduler
from engine.core.sequence import SequenceGroup, SequenceStatus
from engine.requests import check_request_fits, prompt_tokens
from engine.runtime.protocols import ModelRuntime


class Serving:
    """add_request and step, on the engine's scheduler, bookkeeping and runtime."""

    STATE = ()  # none of its own (engine/core/state.py): the parts it was given hold it
    FIXED = ("config", "kv", "scheduler", "registry", "runtime", "content", "_flight", "_post")

    def __init__(self, config: EngineConfig, kv: KVCacheManager, scheduler: Scheduler,
                 registry: Registry, runtime: ModelRuntime, content: KVContent | None,
                 flight: InFlight, post: Postprocessor) -> None:
        self.config, self.kv, self.scheduler, self.registry = config, kv, scheduler, registry
        self.runtime, self.content = runtime, content
        self._flight, self._post = flight, post

    def add_request(self, op: ops.AddRequest) -> tuple[int, list[Event]]:
        params, runtime = op.params, self.runtime
        tokens = prompt_tokens(op.prompt, runtime.tokenizer, runtime.vocab_size,
                               runtime.max_model_len)
        check_request_fits(tokens, params, runtime.max_model_len, self.config.block_size,
                           self.kv.pool.num_blocks)
        registry = self.registry
        rid = registry.next_request_id
        registry.next_request_id += 1
        seq = registry.new_seq(status=SequenceStatus.WAITING, request_id=rid)
        registry.groups[rid] = SequenceGroup(rid, op.prompt_value, tokens, params, [seq],
                                             arrival=rid)
        self.scheduler.add(registry.groups[rid])
        return rid, []  # nothing happens to blocks until a step schedules it

    def step(self, op: ops.Step) -> tuple[StepResult, list[Event]]:
        """schedule -> run -> postprocess. Under async scheduling the postprocess of this step
        may wait for the next one (`InFlight`); what landed in between is reported here."""
        events, finished = self._flight.before_step()
        sched = self.scheduler.schedule()                        # schedule
        events += sched.events
        launched = self._run(sched, events)                      # run
        finished += self._flight.after_launch(launched, events)  # postprocess
        for group in sched.aborted:  # a step landing after the abort may have ended it already
            if group.request_id in self.registry.groups:
                finished.append(self._post.finish_group(group, events, aborted=True))
        result = StepResult(self.kv.step, events, finished, self._post.lazy_outputs(),
                            sched.num_tokens, len(sched.prefills), len(sched.decodes))
        return result, events

    def _run(self, sched: ScheduledStep, events: list[Event]) -> Launched | None:
        """One forward pass over every scheduled token, then the step's picks launched."""
        step = self.kv.step
        scores = step_run.execute(sched, events, step, self.runtime, self._flight.last_picks,
                                  self.kv.take_copies(), self.content, self.kv.take_stores())
        return step_run.pick(sched, scores, step, self.registry, self.config.seed,
                             self.config.async_scheduling)
