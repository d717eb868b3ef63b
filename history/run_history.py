"""One run's history: its engine config, its op log, a cursor, the frame recorded at each position,
checkpoints, and the one engine at some position of the log. The Playground and Serving session
(ui/session.py), a lesson (lessons/runner.py), a lesson played in a classroom room and a
ZeroGPU call (ui/gpu_jobs.py) all keep their run here; what a page shows beside it (a selection,
a lesson's narration) lives with them, not here.

The op log is the source of truth: the engine at position p is the engine of the log's config
after the log's first p entries, and a replay from the start gives it bit for bit. Back, Next
and the timeline move the cursor and draw the frame recorded there, with no engine work. The
engine moves only when asked for at a position (to act there, to read its K/V), and then from
where it is, or from the nearest checkpoint before that position, never from the start unless it
must. Acting at a past position drops the future, as an editor does.

A log entry is an operation record of engine/ops.py, or `{"op": "engine", "config": {...}}`: a
fresh engine with another config from there on (a lesson's `engine` verb). Every engine access
holds `lock`, so two threads of one page never build two engines or interleave two operations.
Nothing here imports torch (tests/history/test_torch_free_history.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from engine import EngineConfig, LLMEngine, OutOfBlocks, ops
from history.frame import Frame
from history.shelf import Shelf

#: the log entry that starts a fresh engine with another config
NEW_ENGINE = "engine"

#: asked before an engine of a config is built, and told of it once built: either may refuse
#: (raise), and a refused engine is closed at once (ui/session.py counts engines in a budget)
Admit = Callable[[EngineConfig], None]
Hold = Callable[[LLMEngine], None]


class RunHistory:
    def __init__(self, config: EngineConfig, admit: Admit | None = None,
                 hold: Hold | None = None) -> None:
        if not isinstance(config, EngineConfig):
            raise ValueError(f"a run needs an EngineConfig, got {type(config).__name__}")
        self.config = config  # the config at position 0
        self.log: list[dict[str, Any]] = []
        self.pos = 0  # the cursor: the page shows the run after log[:pos]
        self.lock = threading.RLock()
        self.notice = ""  # a sentence for the page (a replay that disagreed with adopted frames)
        self._admit, self._hold = admit, hold
        self._frames: dict[int, Frame] = {}
        self._adopted: set[int] = set()  # positions whose frames came from elsewhere (a GPU call)
        self._elsewhere = "the other device"  # where they came from, in words
        self._shelf = Shelf()
        self._engine: LLMEngine | None = None
        self._at: int | None = None  # the engine is at log[:_at]; None: at no position of the log

    # ---- reading: the cursor, frames, the config and trace at a position -----------------------

    def __len__(self) -> int:
        return len(self.log)

    def frame(self, pos: int | None = None) -> Frame:
        """What the page draws at `pos` (the cursor by default): recorded, or recorded now (the
        engine moves there)."""
        pos = self.pos if pos is None else pos
        frame = self._frames.get(pos)
        if frame is None:
            with self.lock:
                eng = self.engine_at(pos)
                frame = self._frames.get(pos) or self._record(eng)
        return frame

    def recorded(self, pos: int) -> Frame | None:
        """The frame recorded at `pos`, if any (no engine work)."""
        return self._frames.get(pos)

    def config_at(self, pos: int) -> EngineConfig:
        """The engine config the run has at `pos`."""
        start = self.segment_start(pos)
        return self.config if start == 0 else EngineConfig.from_dict(self.log[start - 1]["config"])

    def segment_start(self, pos: int) -> int:
        """Where the engine of position `pos` starts: after the last config change before it."""
        for i in range(min(pos, len(self.log)) - 1, -1, -1):
            if self.log[i].get("op") == NEW_ENGINE:
                return i + 1
        return 0

    def trace_at(self, pos: int) -> list[dict[str, Any]]:
        """The engine's op log at `pos`: the operations since its config (what a replay runs)."""
        return [dict(r) for r in self.log[self.segment_start(pos): pos]]

    def behind(self, pos: int | None = None) -> list[dict[str, Any]]:
        """The operations the engine would apply to reach `pos` (the cursor by default)."""
        pos = self.pos if pos is None else pos
        start = self._start_for(pos)
        return [dict(r) for r in self.log[start[0]: pos] if r.get("op") != NEW_ENGINE]

    def engine_ready(self, pos: int | None = None) -> bool:
        """Whether the engine is at `pos` (the cursor by default) now: asking costs nothing."""
        return self._engine is not None and self._at == (self.pos if pos is None else pos)

    def checkpoint_positions(self) -> list[int]:
        return self._shelf.positions()

    def checkpoint_bytes(self) -> int:
        return self._shelf.held_bytes()

    # ---- the engine ------------------------------------------------------------------------------

    @property
    def engine(self) -> LLMEngine:
        """The engine at the cursor (moved there if it is elsewhere)."""
        return self.engine_at(self.pos)

    def engine_at(self, pos: int) -> LLMEngine:
        """The engine at position `pos`, moved there if it is elsewhere; the cursor stays."""
        if not 0 <= pos <= len(self.log):
            raise ValueError(f"position {pos} is not in this run's log of {len(self.log)} entries")
        with self.lock:
            if self._engine is None or self._at != pos:
                self._move(pos)
            return self._engine

    def any_engine(self) -> LLMEngine:
        """An engine of this run at whatever position it is (for what is the same at every
        position: decoding tokens, the hash chain), built at the cursor if there is none."""
        with self.lock:
            return self._engine if self._engine is not None else self.engine_at(self.pos)

    def decode(self, token_ids: Any) -> str:
        return self.any_engine().decode(list(token_ids))

    def prefix_tree(self, frame: Frame) -> Any:
        """The prefix cache of a recorded frame as a tree (engine PrefixTree), from the engine
        wherever it is: a hash's parent is fixed by its tokens, so any position's chain serves."""
        return self.any_engine().prefix_tree(frame.snapshot)

    # ---- acting and moving -------------------------------------------------------------------------

    def act(self, op: ops.Op | dict[str, Any], frame: bool = True) -> Any:
        """Run one operation at the cursor; the future after the cursor is dropped. Returns what
        the operation returns. A refused operation (ValueError, OutOfBlocks) changes nothing; an
        unexpected failure drops the engine (the log holds only operations that succeeded, so
        the next use rebuilds it) and re-raises."""
        op = ops.as_op(op)
        record = op.to_record()
        with self.lock:
            eng = self.engine_at(self.pos)
            try:
                result = eng.apply(op)
            except (ValueError, OutOfBlocks):
                raise
            except Exception:
                self._lose_engine()
                raise
            self._truncate(self.pos)
            self.log.append(record)
            self.pos = self._at = len(self.log)
            self._settled(eng, frame)
            return result

    def replay(self, records: list[dict[str, Any]]) -> None:
        """Act every record at the cursor, recording the last frame only (a trace imported, a
        log replayed on another device)."""
        for i, record in enumerate(records):
            self.act(record, frame=i == len(records) - 1)

    def reconfigure(self, config: EngineConfig) -> LLMEngine:
        """A fresh engine with `config` from the cursor on (a lesson's `engine` verb); the future
        is dropped. Returns the new engine."""
        with self.lock:
            self._truncate(self.pos)
            self.log.append({"op": NEW_ENGINE, "config": config.to_dict()})
            self.pos = len(self.log)
            self._build(config, self.pos)
            return self._engine

    def goto(self, pos: int) -> None:
        """Move the cursor (clamped to the log); the page draws the frame recorded there."""
        with self.lock:
            self.pos = max(0, min(int(pos), len(self.log)))
            if self.pos not in self._frames:  # e.g. a run rebuilt from its pickled log
                self._record(self.engine_at(self.pos))

    def undo(self) -> None:
        """One entry back, and the future dropped."""
        with self.lock:
            self.pos = max(0, self.pos - 1)
            self._truncate(self.pos)

    def truncate(self) -> None:
        """Drop what comes after the cursor."""
        with self.lock:
            self._truncate(self.pos)

    def adopt(self, base: int, records: list[dict[str, Any]], frames: dict[int, Frame],
              elsewhere: str = "the other device") -> None:
        """Take on operations run `elsewhere` from position `base` (a GPU call: ui/gpu_jobs.py)
        and the frames recorded there. Back, Next and the timeline draw those; the engine here
        replays the operations only when it is asked to, checked against the frames."""
        with self.lock:
            if base != self.pos or base > len(self.log):
                raise ValueError("this run moved while the other device ran; press the button again")
            self._truncate(base)
            self.log.extend(records)
            self._frames.update(frames)
            self._adopted.update(frames)
            self._elsewhere = elsewhere
            self.pos = len(self.log)

    def let_go(self) -> bool:
        """Let go of the engine and its checkpoints now (the log and frames stay; the next use
        rebuilds the engine from the log). Whether there was one."""
        with self.lock:
            held = self._engine is not None
            self._lose_engine()
            return held

    def take_notice(self) -> str:
        notice, self.notice = self.notice, ""
        return notice

    # ---- inside --------------------------------------------------------------------------------------

    def _move(self, target: int) -> None:
        """Bring the engine to log[:target]: from where it is, from the nearest checkpoint, or
        from a fresh engine at the target's segment start, whichever is nearest behind it."""
        start, checkpoint = self._start_for(target)
        if checkpoint is not None:
            self._engine.restore(checkpoint)
            self._at = start
        elif self._engine is None or self._at != start:
            self._build(self.config_at(target), start)
        eng = self._engine
        for i in range(self._at, target):
            eng.apply(self.log[i])
            self._at = i + 1
            if self._at in self._adopted:
                self._check_adopted(eng)
            self._settled(eng, frame=self._at not in self._frames)

    def _start_for(self, target: int) -> tuple[int, Any]:
        """(position, checkpoint or None) to replay from to reach `target`: the engine where it
        is when that is nearer than every checkpoint, else the nearest checkpoint, else the
        target's segment start (checkpoint None: build or keep the engine there)."""
        seg = self.segment_start(target)
        here = self._at if (self._engine is not None and self._at is not None
                            and seg <= self._at <= target) else None
        kept = self._shelf.best(target, seg)
        if kept is not None and (here is None or kept[0] > here):
            return kept
        return (here if here is not None else seg), None

    def _build(self, config: EngineConfig, at: int) -> None:
        """A fresh engine of `config` at position `at` (a segment start)."""
        self._lose_engine()
        if self._admit is not None:
            self._admit(config)
        eng = LLMEngine(config)
        if self._hold is not None:
            try:
                self._hold(eng)
            except BaseException:
                eng.close()
                raise
        self._engine, self._at = eng, at
        self._settled(eng, frame=at not in self._frames, start=True)

    def _settled(self, eng: LLMEngine, frame: bool, start: bool = False) -> None:
        """After the engine reached a position: record its frame (if asked) and a checkpoint
        where one is due."""
        at = self._at
        if frame and at not in self._frames:
            self._record(eng)
        if self._shelf.due(at, start):
            checkpoint = eng.checkpoint()
            if checkpoint is not None:
                self._shelf.keep(at, checkpoint, self._max_checkpoint_bytes(eng), start)

    def _record(self, eng: LLMEngine) -> Frame:
        frame = self._frames[self._at] = Frame.of(eng)
        return frame

    @staticmethod
    def _max_checkpoint_bytes(eng: LLMEngine) -> int:
        """Checkpoints may hold at most the engine's own KV bytes (pool, swap space, tier)."""
        info = eng.engine_info()
        blocks = info.get("gpu blocks", 0) + info.get("cpu swap blocks", 0) + info.get(
            "cpu tier blocks (prefix cache)", 0)
        return int(info.get("kv bytes per block") or 0) * blocks

    def _check_adopted(self, eng: LLMEngine) -> None:
        """The engine replayed up to a frame another device recorded: the same bookkeeping, or,
        where the two devices' rounding chose another token, the page goes on from this
        engine's frames and says so."""
        if self._frames[self._at].snapshot == eng.snapshot():
            return
        stale = {p for p in self._adopted if p >= self._at}
        self._frames = {p: f for p, f in self._frames.items() if p not in stale}
        self._adopted -= stale
        self.notice = (f"Replayed here, operation {self._at} chose other tokens than "
                       f"{self._elsewhere} did (the two round differently); the page now shows "
                       "this run")

    def _truncate(self, pos: int) -> None:
        """The log now ends at `pos`: what was recorded after it is gone, and an engine past it
        is at no position of the log any more."""
        del self.log[pos:]
        self._frames = {p: f for p, f in self._frames.items() if p <= pos}
        self._adopted = {p for p in self._adopted if p <= pos}
        self._shelf.drop_after(pos)
        if self._at is not None and self._at > pos:
            self._at = None

    def _lose_engine(self) -> None:
        eng, self._engine, self._at = self._engine, None, None
        self._shelf.clear()  # its saved K/V go too (a checkpoint restores into its own engine)
        if eng is not None:
            eng.close()
