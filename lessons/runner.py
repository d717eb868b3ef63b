"""Playing a lesson on a live engine: Next runs a step's ops and fills its narration from the engine,
Back replays the op log up to the step before, Restart starts over.

The engine's op log is the source of truth (DESIGN principle 3): before each step the runner notes
the engine config, the length of the engine's trace and the lesson's bound names. Going back to a
step rebuilds the engine with `LLMEngine.replay(config, trace[:n])` and runs that step again, so
what Back shows is exactly what replaying gives.

UI contract::

    run = LessonRun(lesson)                 # the engine is built on first use
    q = run.question_for_next()             # ask before Next (None when the step has no question)
    view = run.next()                       # StepView: title, narration_markdown, answer, events ...
    run.back(); run.restart(); run.goto(i)  # the views of earlier steps, rebuilt by replay
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from engine import EngineConfig, Event, LLMEngine, OutOfBlocks, SamplingParams
from engine.core.snapshot import Snapshot
from lessons import helpers
from lessons.loader import Lesson, LessonError, Op, Text, lesson_files
from lessons.loader import load as _load
from lessons.safe_eval import Evaluator, UnsafeExpression

MAX_RUN_STEPS = 500


class LessonCheckFailed(LessonError):
    """A check of a lesson did not hold on the engine (the lesson's claim and the engine disagree)."""


@dataclass(frozen=True)
class QuestionView:
    text: str  # Markdown, shown before the step runs
    step_index: int


@dataclass(frozen=True)
class StepView:
    """Everything the UI shows for one executed step."""

    index: int  # 0-based
    total: int
    title: str
    narration_markdown: str
    question: str | None  # the question that was asked before this step
    answer: Any  # computed by the engine after the step ran (None when there is no question)
    answer_text: str | None
    explanation: str | None
    events: tuple[Event, ...]
    snapshot: Snapshot
    checks: tuple[str, ...] = ()  # the checks that held, as written

    @property
    def is_last(self) -> bool:
        return self.index == self.total - 1


@dataclass
class _Mark:
    """The state before a step: enough to rebuild it by replay."""

    config: EngineConfig
    trace: list[dict[str, Any]]
    names: dict[str, Any]
    outputs: dict[int, Any]


@dataclass
class _State:
    names: dict[str, Any] = field(default_factory=dict)  # bound by ops: seq ids, request ids, values
    outputs: dict[int, Any] = field(default_factory=dict)  # request id -> its latest RequestOutput
    events: list[Event] = field(default_factory=list)  # of the current step
    last_result: Any = None


def load(path: str | Any) -> Lesson:
    """Load and check one lesson (names are checked against what the runner provides)."""
    return _load(path, known_names=KNOWN_NAMES)


def load_all(directory: str | Any = None) -> list[Lesson]:
    """Every lesson in lessons/ (or `directory`), sorted by file name."""
    return [load(p) for p in lesson_files(directory)]


class LessonRun:
    """One learner's (or one classroom's) pass through a lesson."""

    def __init__(self, lesson: Lesson, device: str = "auto", dtype: str = "auto",
                 params: Mapping[str, Any] | None = None, check_invariants: bool = True) -> None:
        self.lesson = lesson
        self.base_config = replace(lesson.config, device=device, dtype=dtype)
        self.params = {p.name: p.default for p in lesson.params}
        for k, v in (params or {}).items():
            spec = next((p for p in lesson.params if p.name == k), None)
            if spec is None or v not in spec.choices:
                raise ValueError(f"lesson {lesson.name}: {k}={v!r} is not one of its params' choices")
            self.params[k] = v
        self.check_invariants = check_invariants
        self._engine: LLMEngine | None = None
        self._config = self.base_config
        self._state = _State()
        self._marks: list[_Mark] = []
        self.views: list[StepView] = []

    # ---- the UI's API ----------------------------------------------------------------------------

    @property
    def engine(self) -> LLMEngine:
        if self._engine is None:
            self._engine = LLMEngine(self._config)
        return self._engine

    @property
    def index(self) -> int:
        """How many steps have run (the next step to run is steps[index])."""
        return len(self._marks)

    @property
    def total(self) -> int:
        return len(self.lesson.steps)

    @property
    def done(self) -> bool:
        return self.index >= self.total

    @property
    def current(self) -> StepView | None:
        return self.views[-1] if self.views else None

    def intro_markdown(self) -> str:
        return self._render(self.lesson.intro)

    def question_for_next(self) -> QuestionView | None:
        """The question of the next step, rendered now (before it runs), or None."""
        if self.done:
            return None
        q = self.lesson.steps[self.index].question
        return None if q is None else QuestionView(self._render(q.text), self.index)

    def next(self) -> StepView:
        if self.done:
            raise IndexError(f"lesson {self.lesson.name} has only {self.total} steps")
        eng = self.engine
        self._marks.append(_Mark(self._config, eng.trace, dict(self._state.names),
                                 dict(self._state.outputs)))
        try:
            view = self._run_step(self.index - 1)
        except BaseException:
            self._marks.pop()
            raise
        self.views.append(view)
        return view

    def back(self) -> StepView | None:
        """Show the step before the current one, rebuilt by replay. None: back at the intro."""
        if self.index <= 1:
            self.restart()
            return None
        return self.goto(self.index - 2)

    def restart(self) -> None:
        self._config = self.base_config
        self._engine = LLMEngine(self._config) if self._engine is not None else None
        self._state = _State()
        self._marks.clear()
        self.views.clear()

    def goto(self, index: int) -> StepView:
        """Show step `index` (0-based): replay the op log up to it, then run it."""
        if not 0 <= index < self.total:
            raise IndexError(f"step {index} is not in 0..{self.total - 1}")
        if index >= self.index:
            while self.index <= index:
                view = self.next()
            return view
        mark = self._marks[index]
        self._config = mark.config
        self._engine = LLMEngine.replay(mark.config, mark.trace)
        self._state = _State(dict(mark.names), dict(mark.outputs))
        del self._marks[index:]
        del self.views[index:]
        return self.next()

    def run_all(self) -> list[StepView]:
        while not self.done:
            self.next()
        return list(self.views)

    # ---- running a step --------------------------------------------------------------------------

    def _run_step(self, i: int) -> StepView:
        step = self.lesson.steps[i]
        asked = None if step.question is None else self._render(step.question.text)
        st = self._state
        st.events = []
        for op in step.ops:
            self._run_op(op)
        if self.check_invariants:
            try:
                self.engine.check_invariants()
            except Exception as e:  # an engine bug, but the lesson is where a teacher sees it
                raise LessonCheckFailed(self.lesson.path, step.line, f"engine invariant broken: {e}") from e
        evaluator = self._evaluator()
        held = []
        for c in step.checks:
            try:
                ok = evaluator.eval(c.tree)
            except UnsafeExpression as e:
                raise LessonCheckFailed(self.lesson.path, c.line, f"check {c.source!r} failed to evaluate: "
                                                                  f"{e}") from None
            if not ok:
                raise LessonCheckFailed(self.lesson.path, c.line, f"check failed: {c.source}"
                                                                  f"{self._explain(c.tree, evaluator)}")
            held.append(c.source)
        answer = answer_text = explanation = None
        if step.question is not None:
            answer = self._eval(step.question.answer, step.question.answer_line, evaluator)
            answer_text = _show(answer)
            if step.question.explain is not None:
                explanation = self._render(step.question.explain, evaluator)
        return StepView(i, self.total, step.title, self._render(step.narration, evaluator), asked, answer,
                        answer_text, explanation, tuple(st.events), self.engine.snapshot(), tuple(held))

    def _run_op(self, op: Op) -> None:
        ev = self._evaluator()
        args = [self._eval(a, op.line, ev) for a in op.args]
        kwargs = {k: self._eval(v, op.line, ev) for k, v in op.kwargs}
        try:
            result = self._do(op, args, kwargs)
        except (ValueError, OutOfBlocks, RuntimeError) as e:
            if isinstance(e, LessonError):
                raise
            if op.expect_error:
                if op.target:
                    self._state.names[op.target] = str(e)
                return
            raise LessonError(self.lesson.path, op.line, f"'{op.source}' failed: {e}") from None
        if op.expect_error:
            raise LessonCheckFailed(self.lesson.path, op.line, f"'{op.source}' was expected to fail "
                                                               f"but succeeded")
        if op.target:
            self._state.names[op.target] = result

    def _do(self, op: Op, args: list[Any], kw: dict[str, Any]) -> Any:
        eng, st = self.engine, self._state
        name = op.name
        if name == "let":
            return args[0]
        if name == "add_sequence":
            result = eng.add_sequence(_prompt(args[0]))
        elif name == "append":
            seq = _seq_id(args[0])
            if "tokens" in kw:
                result = eng.append(seq, token_ids=list(kw["tokens"]))
            elif "text" in kw:
                result = eng.append(seq, token_ids=eng.tokenizer.encode(kw["text"]))
            else:
                result = eng.append(seq, n=kw.get("n", 1))
            result = None
        elif name == "fork":
            result = eng.fork(_seq_id(args[0]))
        elif name == "free":
            events: list[Event] = []
            for a in args:
                eng.free(_seq_id(a))
                events += eng.last_events
            st.events += events
            return None
        elif name == "request":
            if "stop" in kw:
                kw["stop"] = tuple([kw["stop"]] if isinstance(kw["stop"], str) else kw["stop"])
            result = eng.add_request(_prompt(args[0]), SamplingParams(**kw))
        elif name in ("step", "run"):
            return self._steps(name, kw)
        elif name == "probe":
            seq = _seq_id(args[0])
            probe = helpers.AttentionProbe(eng, _int(kw.get("layer", 0), "layer"))
            with probe.hooks():
                eng.append(seq, n=1)
            st.events += eng.last_events
            return probe.result(seq)
        elif name == "admit":
            # Hundreds of ops: their events are not shown one by one; the snapshot tells the story.
            return helpers.admit(eng, args[0])
        elif name == "engine":
            self._config = replace(self._config, **kw)
            self._engine = LLMEngine(self._config)
            st.outputs.clear()
            return None
        else:  # the loader refuses unknown ops; this is a guard for new ones
            raise LessonError(self.lesson.path, op.line, f"operation {name!r} is not implemented")
        st.events += eng.last_events
        return result

    def _steps(self, name: str, kw: dict[str, Any]) -> Any:
        eng, st = self.engine, self._state
        limit = _int(kw.get("times", 1) if name == "step" else kw.get("max_steps", MAX_RUN_STEPS), "steps")
        finished = []
        for _ in range(limit):
            if name == "run" and not eng.groups:
                break
            res = eng.step()
            st.last_result = res
            st.events += res.events
            for out in list(res.outputs) + list(res.finished):
                st.outputs[out.request_id] = out
            finished += res.finished
            if name == "run" and kw.get("until") in {e.kind for e in res.events}:
                break  # `run until="preempt"`: stop right after the step where it happened
        return finished

    # ---- expressions -----------------------------------------------------------------------------

    def _evaluator(self) -> Evaluator:
        eng, st = self.engine, self._state
        snap = eng.snapshot()
        names: dict[str, Any] = {
            "snap": snap, "metrics": snap.metrics, "blocks": snap.blocks, "seqs": snap.sequences,
            "events": tuple(st.events), "block_size": snap.block_size, "num_blocks": snap.num_blocks,
            "info": MappingProxyType(eng.engine_info()), "dry": eng.config.dry,
            "config": MappingProxyType(eng.config.to_dict()), "model": _model_info(eng),
            "step_number": len(self._marks), "total_steps": self.total, "result": st.last_result,
            "outputs": MappingProxyType(dict(st.outputs)), "ARCHITECTURES": helpers.ARCHITECTURES,
            "params": MappingProxyType(dict(self.params)), "trace_len": len(eng.trace),
            "None": None, "True": True, "False": False,
        }
        names.update(self.params)
        names.update(st.names)
        return Evaluator(names, _helpers(eng, snap, st))

    def _eval(self, tree: ast.Expression, line: int, evaluator: Evaluator | None = None) -> Any:
        try:
            return (evaluator or self._evaluator()).eval(tree)
        except UnsafeExpression as e:
            raise LessonError(self.lesson.path, line, f"{ast.unparse(tree)!r}: {e}") from None

    def _render(self, text: Text, evaluator: Evaluator | None = None) -> str:
        evaluator = evaluator or self._evaluator()
        values = iter([_show(self._eval(tree, line, evaluator)) for _, line, tree in text.exprs])
        from lessons.loader import PLACEHOLDER
        return PLACEHOLDER.sub(lambda m: next(values), text.source)

    def _explain(self, tree: ast.Expression, evaluator: Evaluator) -> str:
        """For a failed comparison, the values on each side: what the engine actually said."""
        node = tree.body
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            try:
                shown = [f"{ast.unparse(p)} = {_show(evaluator.eval(ast.Expression(p)))}" for p in parts]
            except UnsafeExpression:
                return ""
            return " (" + "; ".join(shown) + ")"
        return ""


# ---- the context's helper functions ------------------------------------------------------------------


def _helpers(eng: LLMEngine, snap: Snapshot, st: _State) -> dict[str, Callable[..., Any]]:
    def seq(s: int) -> Any:
        sid = _seq_id(s)
        if sid not in snap.sequences:
            raise ValueError(f"seq {sid} is not live (freed or finished)")
        return snap.sequences[sid]

    def count(kind: str) -> int:
        return sum(1 for e in st.events if e.kind == kind)

    def events_of(kind: str) -> list[Event]:
        return [e for e in st.events if e.kind == kind]

    def block(b: int) -> Any:
        return snap.blocks[b]

    def output(rid: int) -> Any:
        if rid not in st.outputs:
            raise ValueError(f"request {rid} has no output yet (step it first)")
        return st.outputs[rid]

    def same_kv(src: int, dst: int, layer: int = 0, slots: int | None = None) -> bool:
        """Whether two physical blocks hold the same K and V bytes in their first `slots` slots."""
        (k1, v1), (k2, v2) = eng.inspect_block(src, layer), eng.inspect_block(dst, layer)
        n = snap.block_size if slots is None else slots
        return bool((k1[:n] == k2[:n]).all() and (v1[:n] == v2[:n]).all())

    def request_seqs(rid: int) -> list[Any]:
        group = eng.groups.get(rid)
        live = [] if group is None else group.seqs
        return [snap.sequences[s.seq_id] for s in live if s.seq_id in snap.sequences]

    def decode(token_ids: Any) -> str:
        return eng.decode(list(token_ids))

    def shared_blocks() -> list[int]:
        return [b.block_id for b in snap.blocks if b.ref_count > 1]

    def waste(s: int) -> int:
        v = seq(s)
        return len(v.block_table) * snap.block_size - v.num_tokens

    def encode(text: str) -> list[int]:
        return list(eng.tokenizer.encode(text))

    h: dict[str, Callable[..., Any]] = {
        "len": len, "sum": sum, "min": min, "max": max, "abs": abs, "round": round, "sorted": sorted,
        "range": _range, "list": list, "str": str, "int": int, "float": float, "any": any, "all": all,
        "set": lambda x: sorted(set(x)), "join": _join, "show": _show,
        "seq": seq, "table": lambda s: list(seq(s).block_table), "tokens": lambda s: list(seq(s).token_ids),
        "text": lambda s: seq(s).text, "block": block, "ref": lambda b: block(b).ref_count,
        "count": count, "events_of": events_of, "output": output, "same_kv": same_kv,
        "request_seqs": request_seqs, "decode": decode, "shared_blocks": shared_blocks, "waste": waste,
        "encode": encode, "live": lambda s: _seq_id(s) in snap.sequences,
        "reservation_fit": helpers.reservation_fit,
    }
    h.update(helpers.PURE_HELPERS)
    return h


def _model_info(eng: LLMEngine) -> Any:
    if eng.runtime is None:
        return None
    lm = eng.runtime.loaded
    element = {"float32": 4, "float16": 2, "bfloat16": 2}.get(str(lm.dtype).replace("torch.", ""), 0)
    return MappingProxyType({
        "name": lm.name, "layers": lm.num_layers, "q_heads": lm.num_q_heads, "kv_heads": lm.num_kv_heads,
        "head_dim": lm.head_dim, "dtype": str(lm.dtype).replace("torch.", ""), "dtype_bytes": element,
        "max_len": lm.max_position_embeddings, "hidden": int(lm.config.hidden_size),
    })


def _range(*args: int) -> range:
    r = range(*args)
    if len(r) > 1_000_000:
        raise ValueError("range too long")
    return r


def _join(items: Any, sep: str = ", ") -> str:
    return sep.join(_show(x) for x in items)


def _show(value: Any) -> str:
    """How a value appears in narration: ints plainly, floats briefly, lists in brackets."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _seq_id(s: Any) -> int:
    if isinstance(s, bool) or not isinstance(s, int):
        raise ValueError(f"a sequence is named by its id (a bound name like a), got {s!r}")
    return s


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{what} must be a whole number, got {v!r}")
    return v


def _prompt(p: Any) -> str | list[int]:
    if isinstance(p, str):
        return p
    if isinstance(p, list | tuple):
        return list(p)
    raise ValueError(f"a prompt is text or a list of token ids, got {type(p).__name__}")


#: every name an expression may read: the context's names and the helpers (for load-time checks)
KNOWN_NAMES: set[str] = {
    "snap", "metrics", "blocks", "seqs", "events", "block_size", "num_blocks", "info", "dry", "config",
    "model", "step_number", "total_steps", "result", "outputs", "ARCHITECTURES", "params", "trace_len",
    "None", "True", "False",
} | {
    "len", "sum", "min", "max", "abs", "round", "sorted", "range", "list", "str", "int", "float", "any",
    "all",
    "set", "join", "show", "seq", "table", "tokens", "text", "block", "ref", "count", "events_of", "output",
    "same_kv", "request_seqs", "decode", "shared_blocks", "waste", "encode", "live", "reservation_fit",
} | set(helpers.PURE_HELPERS)
