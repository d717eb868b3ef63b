"""LLMEngine: the public facade. The paper's primitives, serving, introspection, the op log and
replay.

The operations themselves live in two parts: the paper's primitives in engine/primitive_ops.py,
serving's `add_request` and `step` (schedule -> run -> postprocess, as nano-vllm's) in
engine/serving_ops.py. This class dispatches them and keeps what every operation shares.

Every public operation is recorded in the op log (`trace`) once it has succeeded, so
`LLMEngine.replay(config, trace)` rebuilds the same state. Operations are all-or-nothing: a bad
argument or a pool too small raises before anything changes.

In dry mode (`EngineConfig(model=None)`) there is no model: prompts are UTF-8 bytes and
`append(seq, n)` draws n tokens from an RNG seeded by the config. Otherwise a real model computes
every token's K/V into the paged pool (see `engine.runtime.runtime`).
"""

from __future__ import annotations

from typing import Any

from engine import checkpoint as checkpoints
from engine import op_log, ops, step_run
from engine.config import EngineConfig
from engine.core.events import Event
from engine.core.hashing import hash_function
from engine.core.in_flight import InFlight
from engine.core.kv_cache_manager import InvariantError, KVCacheManager
from engine.core.kv_content import KVContent
from engine.core.outputs import RequestOutput, StepResult
from engine.core.postprocess import Postprocessor
from engine.core.registry import Registry
from engine.core.request_state import RequestState, request_state
from engine.core.scheduler import Scheduler
from engine.core.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus
from engine.describe.narration import TokenNames
from engine.describe.prefix_tree import HashChain, PrefixTree
from engine.describe.request_timeline import RequestTimeline, RunRecorder
from engine.describe.snapshot import Snapshot, SnapshotBuilder
from engine.dry.dry_runtime import DryRuntime
from engine.engine_info import engine_info
from engine.ops import MAX_APPEND_PER_CALL  # noqa: F401  (importable from here, as before)
from engine.primitive_ops import Primitives
from engine.runtime.protocols import ModelRuntime
from engine.serving_ops import Serving


def _runtime(config: EngineConfig) -> ModelRuntime:
    """The runtime the config asks for: the dry mode's, one process's, or N workers'."""
    if config.dry:
        return DryRuntime(config)
    from engine.runtime.runtime import Runtime  # torch only when there is a model

    if config.tensor_parallel_size > 1:  # N worker processes, one block table
        from engine.tp.runtime import TPRuntime

        return TPRuntime(config)
    return Runtime(config)


class LLMEngine:
    # ---- declared state (engine/checkpoint.py, engine/core/state.py): a checkpoint is the sum
    # of these, never a copy of whatever hangs off the engine (tests/engine/test_checkpoint.py
    # fails on an attribute that is not declared here)
    #: parts that say their own state (`state()` / `load_state()`), restored in this order
    #: (the scheduler's queues hold the registry's requests); content is None unless tracked
    PARTS = ("kv", "content", "registry", "scheduler", "_flight", "_run_record", "_chain")
    #: the engine's own values (numbers, and lists of values never changed once made: events,
    #: outputs, op records), copied container by container by engine/checkpoint.py
    STATE = ("step_count", "last_events", "last_step", "_finished", "_trace")
    #: shared, never copied: the config, the runtime (model, K/V tensors) and its tokenizer, and
    #: the stateless wiring between the parts
    FIXED = ("config", "runtime", "tokenizer", "_post", "_primitives", "_serving")
    #: caches rebuilt after a restore
    DERIVED = ("_snapshots",)

    def __init__(self, config: EngineConfig | None = None) -> None:
        config = config if config is not None else EngineConfig()
        if not isinstance(config, EngineConfig):
            raise ValueError(f"LLMEngine needs an EngineConfig, got {type(config).__name__}")
        self.config = config
        self.runtime: ModelRuntime = _runtime(config)
        groups = self.runtime.kv_cache_groups
        if config.num_offload_blocks and len(groups) > 1:
            self.runtime.close()
            raise ValueError(
                f"the CPU tier of the prefix cache (num_offload_blocks) serves models with one KV "
                f"cache group; this one has {len(groups)} ({', '.join(g.name for g in groups)}): "
                f"use num_offload_blocks=0")
        self.tokenizer: Any = self.runtime.tokenizer
        # how events show a token, when their narration is read: a function of the tokenizer, not
        # of this engine (events outlive steps; pointing back would keep the KV pool alive)
        token_repr = TokenNames(self.tokenizer.decode)
        hash_fn = hash_function(config.prefix_caching_hash_algo, config.hash_seed)
        # what the device's KV slots hold, as labels: checked after every operation
        self.content = KVContent(config.block_size) if config.tracks_kv_content else None
        self.kv = KVCacheManager(self.runtime.num_gpu_blocks, config.block_size,
                                 config.enable_prefix_caching, hash_fn=hash_fn, token_repr=token_repr,
                                 num_cpu_blocks=config.num_cpu_blocks,
                                 num_offload_blocks=config.num_offload_blocks, groups=groups,
                                 content=self.content, fetch_ahead=self.runtime.fetch_ahead,
                                 tier_store=config.tier_store)
        self.registry = Registry()  # live sequences and requests, shared with the postprocess
        self.step_count = 0
        self.last_events: list[Event] = []
        self.last_step: StepResult | None = None
        self._finished: list[RequestOutput] = []  # every finished request's output, in order
        self._trace: list[dict[str, Any]] = []
        self._snapshots = self._snapshot_builder()
        # drafts are verified where that pays: the runtime says what a verification costs
        self.scheduler = Scheduler(config, self.kv, self.registry, self.runtime.draft_cost)
        self._post = Postprocessor(self.kv, self.scheduler, self.registry,
                                   self.runtime.eos_token_ids, self.tokenizer.decode)
        self._flight = InFlight(self._post, self.scheduler, self.kv)
        # the run over time (request timeline) and the hash chain (prefix tree): folded from
        # each operation's events, for views of the past that read no scheduler queue
        self._run_record, self._chain = RunRecorder(), HashChain(hash_fn)
        self._primitives = Primitives(self.kv, self.registry, self.runtime, self.content,
                                      self._flight, self._post)
        self._serving = Serving(config, self.kv, self.scheduler, self.registry, self.runtime,
                                self.content, self._flight, self._post)

    def _snapshot_builder(self) -> SnapshotBuilder:
        k = self.kv
        return SnapshotBuilder(k.pool, self.tokenizer.decode, k.cpu_pool, k.groups, k.tier)

    # ---- what the runtime fixed: the model's vocabulary and length --------------------------

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to vocab_size - 1 (the dry mode: the 256 byte values)."""
        return self.runtime.vocab_size

    @property
    def max_model_len(self) -> int:
        """The most tokens one sequence may hold (the model's positions, or the pool's slots)."""
        return self.runtime.max_model_len

    @property
    def seqs(self) -> dict[int, Sequence]:
        """The live sequences by id (the registry's)."""
        return self.registry.seqs

    @property
    def groups(self) -> dict[int, SequenceGroup]:
        """The unfinished requests by id (the registry's)."""
        return self.registry.groups

    # ---- the paper's primitives ---------------------------------------------------------------

    def add_sequence(self, prompt: str | list[int]) -> int:
        """Allocate and prefill a prompt (prefix cache consulted). Returns the new seq id."""
        return self._apply(ops.AddSequence(prompt))

    def append(self, seq: int, n: int | None = None, token_ids: list[int] | None = None
               ) -> list[Event]:
        """Append n model-chosen tokens (the pending one first), or exactly `token_ids`."""
        return self._apply(ops.Append(seq, n, token_ids))

    def fork(self, seq: int) -> int:
        """A child sharing every block of the parent (ref counts + 1). Returns the child's id."""
        return self._apply(ops.Fork(seq))

    def free(self, seq: int) -> list[Event]:
        """Drop a sequence: every block's ref count - 1; blocks reaching 0 are cached or free."""
        return self._apply(ops.Free(seq))

    # ---- serving ------------------------------------------------------------------------------

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None) -> int:
        """Queue a request; it joins the next step. Returns the request id."""
        return self._apply(ops.AddRequest(prompt, params))

    def step(self) -> StepResult:
        """One scheduler iteration: schedule, run, postprocess."""
        return self._apply(ops.Step())

    def generate(self, prompts: str | list[str] | list[list[int]],
                 params: SamplingParams | None = None) -> list[RequestOutput]:
        """Add the prompts as requests and step until all of them finish."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        ids = [self.add_request(p, params) for p in prompts]
        done: dict[int, RequestOutput] = {}
        while any(i not in done for i in ids):
            result = self.step()
            for out in result.finished:
                done[out.request_id] = out
            if result.num_batched_tokens == 0 and not result.finished and not result.events:
                raise RuntimeError(
                    "no request can run: the pool is held by sequences outside the scheduler; "
                    "free some of them")
        return [done[i] for i in ids]

    # ---- introspection --------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        counters = self.kv.counters()
        mode = "dry" if self.config.dry else str(self.config.model)
        sched = self.scheduler
        last = self.last_step
        extra = {
            "requests_running": len(sched.running),
            "requests_waiting": len(sched.waiting),
            "requests_swapped": len(sched.swapped),
            "preemptions": sched.num_preemptions,
            "batched_tokens": last.num_batched_tokens if last else 0,
            "cpu_blocks_used": self.kv.cpu_pool.num_blocks - self.kv.cpu_pool.num_allocatable,
        }
        return self._snapshots.build(self.step_count, list(self.seqs.values()), counters, mode, extra)

    def check_invariants(self) -> None:
        by_status: dict[SequenceStatus, list[Sequence]] = {st: [] for st in SequenceStatus}
        for sid, s in self.seqs.items():
            if s.seq_id != sid:
                raise InvariantError(f"sequence registered as {sid} calls itself {s.seq_id}")
            by_status[s.status].append(s)
        self.kv.check_invariants(by_status[SequenceStatus.RUNNING], by_status[SequenceStatus.SWAPPED])
        if self.kv.writer.copies:  # every copy the bookkeeping made reached the runtime
            raise InvariantError(f"block copies never made: {self.kv.writer.copies}")
        if self.content is not None:
            self._check_content(everything=True)
        for s in by_status[SequenceStatus.WAITING] + by_status[SequenceStatus.FINISHED]:
            if any(s.block_tables):
                raise InvariantError(f"seq {s.seq_id} is {s.status.value} but holds blocks "
                                     f"{s.block_tables}")

    @property
    def trace(self) -> list[dict[str, Any]]:
        """The op log: every operation that succeeded, in order (a copy)."""
        return [dict(op) for op in self._trace]

    def export_trace(self) -> dict[str, Any]:
        """The op log with the config it ran under: JSON-ready, replayable anywhere."""
        return op_log.export(self.config, self.trace)

    @classmethod
    def replay(cls, config: EngineConfig, trace: list[dict[str, Any]]) -> LLMEngine:
        """A new engine with the same config that runs the same ops: the same state."""
        op_log.check_ops(trace)
        engine = cls(config)
        op_log.run(engine._apply, trace)
        return engine

    def checkpoint(self) -> checkpoints.Checkpoint | None:
        """This state, to `restore` later without a replay (engine/checkpoint.py); None while a
        step is in flight or under tensor parallelism."""
        return checkpoints.take(self) if checkpoints.can_take(self) else None

    def restore(self, checkpoint: checkpoints.Checkpoint) -> None:
        """Back to the state `checkpoint` was taken in (on this engine or another of the same
        config); the ops after it are gone from the log."""
        checkpoints.restore(self, checkpoint)

    @classmethod
    def from_trace(cls, data: dict[str, Any]) -> LLMEngine:
        """Rebuild an engine from `export_trace()` output."""
        return cls.replay(*op_log.parse(data))

    def decode(self, token_ids: list[int] | tuple[int, ...]) -> str:
        return self.tokenizer.decode(list(token_ids))

    def engine_info(self) -> dict[str, Any]:
        """What this engine is: model, device, kernel, pool and its sizes (the UI's Engine tab)."""
        return engine_info(self.config, self.kv, self.runtime)

    # ---- public queries: what callers outside engine/ may read, instead of its insides ----------

    def has_pending_work(self) -> bool:
        """Whether a request is waiting, running or swapped out, or a step's tokens are still on
        their way (async scheduling): whether a step would do something."""
        return self.scheduler.has_work() or self._flight.launched is not None

    def current_step(self) -> int:
        """The number of the last operation (every event of it carries this step)."""
        return self.kv.step

    def pool_size(self) -> int:
        """Physical blocks in the GPU pool."""
        return self.kv.pool.num_blocks

    def num_allocatable_blocks(self) -> int:
        """Blocks an allocation may take now: free ones plus cached ones it may evict."""
        return self.kv.pool.num_allocatable

    def block_table(self, seq_id: int) -> tuple[int | None, ...]:
        """The (first KV cache group's) block table of a sequence the engine holds (empty while
        it waits)."""
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise ValueError(f"unknown sequence id {seq_id!r}")
        return tuple(seq.block_table)

    def requests(self) -> list[RequestState]:
        """Every unfinished request, in queue order: waiting, running, swapped."""
        sched = self.scheduler
        queues = (("waiting", sched.waiting), ("running", sched.running), ("swapped", sched.swapped))
        return [request_state(g, status) for status, queue in queues for g in queue]

    def request(self, request_id: int) -> RequestState | None:
        """One unfinished request by id; None once it finished (or if it never was)."""
        return next((r for r in self.requests() if r.request_id == request_id), None)

    def request_timeline(self) -> RequestTimeline:
        """Every serving request and what it did in each step so far (waiting, a prefill chunk,
        decodes, drafts kept / drafted, preempted by swap or recompute, swapped, loading from
        the CPU tier, finished and why): engine/describe/request_timeline.py."""
        return self._run_record.timeline()

    def prefix_tree(self, snapshot: Snapshot | None = None, group: str | None = None
                    ) -> PrefixTree:
        """The prefix cache of `snapshot` (now, by default) as a tree of hashed blocks, each
        under the block its hash chains from, in KV cache group `group` (the first by default):
        engine/describe/prefix_tree.py."""
        return self._chain.tree(snapshot if snapshot is not None else self.snapshot(), group)

    def finished_requests(self) -> list[RequestOutput]:
        """The final outputs of every request finished so far, in the order steps reported them
        (each step's `StepResult.finished`); a replay of the op log rebuilds the same list."""
        return list(self._finished)

    def encode(self, text: str) -> list[int]:
        """The token ids of `text` in this engine's tokenizer."""
        return list(self.tokenizer.encode(text))

    def loaded_model(self) -> Any:
        """The loaded model (runtime.models.LoadedModel: HF module, heads, sizes); None if dry."""
        return self.runtime.loaded

    def module_path(self) -> Any:
        """A context in which forward passes run through the HF modules, so hooks on them fire
        (the lessons' attention probe). Real mode in one process only."""
        return self.runtime.module_path()

    def close(self) -> None:
        """Let go of the engine's resources now: the KV pool, swap space, decode graphs and
        workspaces, and under tensor parallelism the worker processes (idempotent). A dropped
        engine frees them too, without waiting for the garbage collector."""
        self.runtime.close()

    def inspect_block(self, block_id: int, layer: int, rank: int | None = None
                      ) -> tuple[Any, Any]:
        """The real K and V of one physical block in one layer (CPU float tensors,
        [block_size, kv_heads, head_dim]). Real mode only: the dry mode has no tensors. A hybrid
        model's block holds the layers of the KV cache group that allocated it.
        Under tensor parallelism, `rank` picks one worker's slice (kv_heads / N heads)."""
        nb, nl = self.kv.pool.num_blocks, self.runtime.num_layers
        if not nl:  # no layers, no K/V: the runtime says why
            return self.runtime.read_block(block_id, layer, rank)
        for name, v, hi in (("block id", block_id, nb), ("layer", layer, nl)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < hi:
                raise ValueError(f"{name} must be a whole number from 0 to {hi - 1}, got {v!r}")
        group = self.kv.groups[self.kv.pool.blocks[block_id].group]
        if len(self.kv.groups) > 1 and layer not in group.layers:  # its page holds other layers
            raise ValueError(f"block {block_id} holds the K/V of the {group.name} layers "
                             f"({', '.join(map(str, group.layers))}); layer {layer} is not one "
                             f"of them")
        return self.runtime.read_block(block_id, layer, rank)

    # ---- dispatch --------------------------------------------------------------------------------

    def apply(self, op: ops.Op | dict[str, Any]) -> Any:
        """Run one operation (engine.ops) or op-log record; returns what its primitive returns."""
        return self._apply(op)

    def _apply(self, op: ops.Op | dict[str, Any]) -> Any:
        op = ops.as_op(op)  # a record is parsed (and its arguments checked) by engine/ops.py
        self.kv.step = self.step_count + 1
        if not isinstance(op, ops.Step | ops.AddRequest):
            self._flight.settle()  # async scheduling: a primitive works on settled sequences
        result, events = self._OPS[op.name](self, op)
        # the tier's stores of blocks computed in it (a step's landed tokens': tier_store=
        # "computed") are made before it ends: no tier slot waits for its bytes between operations
        step_run.move_blocks(self.runtime, self.kv.take_stores(events), self.content)
        if self.kv.sliding:  # sliding-window groups let go of what their windows have passed
            events += self._drop_out_of_window()
        self.step_count += 1
        self.last_events = events
        self._trace.append(op.to_record())
        self._run_record.note(op.name, self.kv.step, result, events, self.groups)
        self._chain.note(events, self.seqs)
        if self.content is not None:  # what this operation wrote or shared reads back right
            shared = [b for e in events if e.kind in ("prefix_hit", "share") for b in e.block_ids]
            self._check_content(everything=False, shared=shared)
        return result

    def _check_content(self, everything: bool, shared: list[int] = ()) -> None:
        k = self.kv
        self.content.verify(self.seqs, k.pool, k.cpu_pool, k.tier, everything, shared)

    def _drop_out_of_window(self) -> list[Event]:
        running = SequenceStatus.RUNNING
        return self.kv.drop_out_of_window_all(s for s in self.seqs.values() if s.status is running)

    def _op_step(self, op: ops.Step) -> tuple[StepResult, list[Event]]:
        result, events = self._serving.step(op)
        self.last_step = result
        self._finished += result.finished
        return result, events

    # the handler of each operation of engine/ops.py, by its op-log name
    _OPS = {
        ops.AddSequence.name: lambda eng, op: eng._primitives.add_sequence(op),
        ops.Append.name: lambda eng, op: eng._primitives.append(op),
        ops.Fork.name: lambda eng, op: eng._primitives.fork(op),
        ops.Free.name: lambda eng, op: eng._primitives.free(op),
        ops.AddRequest.name: lambda eng, op: eng._serving.add_request(op),
        ops.Step.name: _op_step,
        ops.SetPrefixCaching.name: lambda eng, op: eng._primitives.set_prefix_caching(op),
    }
