"""One classroom room: one engine shared by a whole class, stepping in its own thread.

Students' prompts become requests of the room's engine (`add_request`, the same scheduler as the
serving tab); a background thread calls `step()` while there is work and the room is not paused.
Everything that touches the engine holds the room's one lock; after each change the room
publishes a read-only `RoomView` (records.py) that pages and the API read without the lock, so a
class polling the state never slows the engine down.

The teacher's actions (only with the room's secret): pause, resume, single step, shrink the pool
(the room takes blocks away from the class by holding them in a sequence of its own, labelled
"reserved" in the picture, so running requests get preempted), restore it, prefix caching on or
off, clear (a fresh engine; every request so far is dropped) and close.
"""

from __future__ import annotations

import hmac
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from classroom.poll import RoomLesson
from classroom.records import RoomRequest, RoomView
from classroom.reserve import Reserve
from classroom.settings import RoomError, RoomSettings, check_text
from engine import LLMEngine, SamplingParams, ops
from engine.describe.memory_use import MemoryPoint, memory_point
from engine.requests import chat_prompt

#: the teacher's actions: room verbs (pause, resume, clear, shrink, restore, close) and engine
#: operations of engine/ops.py (step, prefix caching on / off); Room.control maps each to its doing
ACTIONS = ("pause", "resume", "step", "clear", "shrink", "restore", "prefix_on", "prefix_off", "close")
#: the teacher's actions on the lesson the room plays (Room.lesson_control)
LESSON_ACTIONS = ("play", "next", "end")
RESERVED = "reserved by the teacher"
MAX_POINTS = 5000  # memory over time: the steps a room keeps (a class of hours, not days)


class Room:
    def __init__(self, code: str, secret: str, settings: RoomSettings, device: str = "auto",
                 idle_seconds: float = 1800, on_close: Callable[[Room], None] | None = None) -> None:
        self.code, self.secret, self.settings = code, secret, settings
        self._config = settings.engine_config(device)
        self._device = device
        try:
            self.engine = LLMEngine(self._config)
        except (ValueError, RuntimeError, OSError) as err:
            raise RoomError(f"the room's engine could not start: {err}") from err
        self._tokenizer = self.engine.tokenizer  # the same for every engine of this room
        self.idle_seconds = idle_seconds
        self._on_close = on_close
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self.requests: dict[int, RoomRequest] = {}
        self._students: dict[str, str] = {}  # a browser session or API client -> its label
        self._sent: dict[str, int] = {}  # requests each student sent since the last clear
        self._id_base = 0  # room id = engine request id + this (engine ids restart at a clear)
        self._cleared_below = 0  # room ids under this were dropped by a clear
        self.paused = False
        self.closed = False
        self.prefix_caching = True
        self.error = ""
        self._reserve = Reserve()  # blocks the teacher took away from the class (Shrink pool)
        self._last_activity = time.monotonic()
        self._memory: list[MemoryPoint] = []  # a point per step since the last clear
        self.view = RoomView({})
        self.lesson: RoomLesson | None = None  # a lesson the teacher plays here, its questions polled
        with self._lock:
            self._publish()
        self._thread = threading.Thread(target=self._loop, name=f"room-{code}", daemon=True)
        self._thread.start()

    # ---- students ------------------------------------------------------------------------------

    def submit(self, student_key: str, prompt: Any, name: str = "") -> int:
        """Queue a student's prompt; returns the request's id in this room."""
        if self.closed:
            raise RoomError(f"room {self.code} is closed")
        if not isinstance(prompt, str) or not prompt.strip():
            raise RoomError("type a prompt first")
        prompt = prompt.strip()
        most = self.settings.max_prompt_chars
        if len(prompt) > most:
            raise RoomError(f"your prompt has {len(prompt)} characters; this room takes at most {most}")
        check_text(prompt, "your prompt")
        name = (name or "").strip()[:24] if isinstance(name, str) else ""
        check_text(name, "your name")
        ids = self._prompt_ids(prompt)  # outside the lock: tokenizing needs no engine state
        with self._lock:
            if self.closed:
                raise RoomError(f"room {self.code} is closed")
            label = self._students.get(student_key)
            if label is None and len(self._students) >= self.settings.max_students:
                raise RoomError(f"room {self.code} is full: it has {len(self._students)} students, the "
                                "most the teacher allowed")
            sent = self._sent.get(student_key, 0)
            if sent >= self.settings.requests_per_student:
                raise RoomError(f"you have sent {sent} requests, the most this room allows each student")
            need = self._blocks_for(len(ids) if isinstance(ids, list) else len(self._tokenizer.encode(ids)))
            if need > self._usable_blocks():
                raise RoomError(f"your prompt and its answer need {need} blocks, but the pool has "
                                f"{self._usable_blocks()} for the class now; shorten the prompt")
            try:
                rid = self.engine.apply(ops.AddRequest(ids, SamplingParams(
                max_tokens=self.settings.max_tokens, temperature=0.0)))
            except ValueError as err:
                raise RoomError(str(err)) from err
            label = self._label(student_key, name)
            self._sent[student_key] = sent + 1
            room_id = self._id_base + rid
            n_tokens = self.engine.request(rid).num_prompt_tokens
            self.requests[room_id] = RoomRequest(room_id, label, prompt, n_tokens, time.monotonic())
            self._touch()
            self._publish()
            self._wake.notify()
        return room_id

    def _prompt_ids(self, prompt: str) -> list[int] | str:
        """The engine's prompt: the model's chat template with the shared system prompt first
        (one identical prefix for the whole class), or plain text in the dry mode."""
        system = self.settings.system_prompt
        ids = chat_prompt(self._tokenizer, prompt, system)
        return ids if ids is not None else (f"{system}\n\n{prompt}" if system else prompt)

    def _label(self, student_key: str, name: str) -> str:
        """The student's label, made (or changed to the name they typed now); under the lock."""
        label = self._students.get(student_key)
        if label is None or (name and name != label):  # a new student, or a name changed
            label = self._new_label(name, student_key)
            self._students[student_key] = label
        return label

    def _new_label(self, name: str, student_key: str = "") -> str:
        """The name as the student typed it (each request keeps the name it was sent with), made
        unique against the other students' names; "student N" without one."""
        if name and self._students.get(student_key, "").startswith(name):
            return self._students[student_key]  # the same name typed again: the same label
        taken = {v for k, v in self._students.items() if k != student_key}
        label = name or f"student {len(self._students) + 1}"
        k = 2
        while label in taken:
            label, k = f"{name or 'student'} ({k})", k + 1
        return label

    def answer(self, student_key: str, raw: Any, name: str = "") -> str:
        """A student's answer to the open question of the lesson the room plays (classroom/poll.py);
        returns it as the projector counts it."""
        lesson = self.lesson
        if lesson is None:
            raise RoomError("the teacher is not playing a lesson in this room now")
        name = (name or "").strip()[:24] if isinstance(name, str) else ""
        check_text(name, "your name")
        with self._lock:
            if self.closed:
                raise RoomError(f"room {self.code} is closed")
            if student_key not in self._students and len(self._students) >= self.settings.max_students:
                raise RoomError(f"room {self.code} is full: it has {len(self._students)} students")
            label = self._label(student_key, name)
            self._touch()
        return lesson.answer(student_key, label, raw)

    def lesson_control(self, secret: Any, action: Any, value: Any = "") -> str:
        """The teacher plays a lesson in the room: `play` (value: its name), `next`, `end`."""
        self.check_secret(secret)
        if self.closed:
            raise RoomError(f"room {self.code} is closed")
        self._touch()
        if action == "play":  # the lesson's engine is built outside the room's lock
            new = RoomLesson(value, self._device)
            old, self.lesson = self.lesson, new
            if old is not None:
                old.close()
            return f"playing {new.view.title}: Next shows its first page"
        lesson = self.lesson
        if action not in LESSON_ACTIONS:
            raise RoomError(f"unknown lesson action {action!r}; one of: {', '.join(LESSON_ACTIONS)}")
        if lesson is None:
            raise RoomError("no lesson is playing: play one first")
        if action == "end":
            self.lesson = None
            lesson.close()
            return "the lesson ended"
        return lesson.next()

    def poll_answers(self, secret: Any) -> list[dict[str, Any]]:
        """Who answered what to the lesson's question on screen: for the teacher only."""
        self.check_secret(secret)
        return [] if self.lesson is None else self.lesson.answers()

    def cleared(self, room_id: int) -> bool:
        return room_id < self._cleared_below

    # ---- the teacher ---------------------------------------------------------------------------

    def check_secret(self, secret: Any) -> None:
        if not isinstance(secret, str) or not hmac.compare_digest(secret.encode(), self.secret.encode()):
            raise RoomError("only the teacher can control this room: the secret is not this room's")

    def control(self, secret: Any, action: Any, value: Any = None) -> str:
        """A teacher's action; returns a sentence saying what happened."""
        self.check_secret(secret)
        if action not in ACTIONS:
            raise RoomError(f"unknown action {action!r}; one of: {', '.join(ACTIONS)}")
        if action == "close":
            self.close()
            return f"room {self.code} is closed"
        with self._lock:
            if self.closed:
                raise RoomError(f"room {self.code} is closed")
            try:
                return self._actions()[action](value)
            finally:  # a refused action may have paused the room: the view must say so
                self._touch()
                self._publish()
                self._wake.notify()

    def _actions(self) -> dict[str, Callable[[Any], str]]:
        """Each action (but close, which takes the lock itself) and what does it."""
        return {"pause": self._do_pause, "resume": self._do_resume, "step": self._do_step,
                "clear": self._do_clear, "shrink": self._do_shrink, "restore": self._do_restore,
                "prefix_on": lambda _: self._set_prefix(True),
                "prefix_off": lambda _: self._set_prefix(False)}

    def _do_pause(self, _: Any) -> str:
        self.paused = True
        return "paused: the engine waits for Step or Resume"

    def _do_resume(self, _: Any) -> str:
        self.paused, self.error = False, ""
        return "running"

    def _do_step(self, _: Any) -> str:
        if not self.engine.has_pending_work():  # refused: the room goes on as it was
            raise RoomError("nothing to step: no request is waiting, running or preempted; "
                            "wait for a student to press Send")
        self.paused = True
        self._step()
        return f"paused after step {self.engine.current_step()}"

    def _do_clear(self, _: Any) -> str:
        self._cleared_below = self._id_base = self._id_base + len(self.requests)
        # the old engine (and its KV pool) goes with it; the new one starts as the teacher left
        # prefix caching
        self.engine = LLMEngine(replace(self._config, enable_prefix_caching=self.prefix_caching))
        self._memory = []
        self.requests.clear()
        self._students.clear()
        self._sent.clear()
        self._reserve.forget()
        self.error = ""
        return "cleared: a fresh engine, no requests, every student may send again"

    def _do_shrink(self, value: Any) -> str:
        """Leave `value` blocks of the pool to the class; the rest the room holds itself."""
        least = self._least_usable()
        total = self.engine.pool_size()
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= total:
            raise RoomError(f"shrink the pool to a whole number of blocks from {least} (what the "
                            f"largest request needs) to {total}, got {value!r}")
        self._reserve.release(self.engine)
        self._reserve.target = total - value
        self._reserve.top_up(self.engine)
        held = self._reserve.blocks(self.engine)
        return (f"the class now has {value} of {total} blocks ({held} taken so far; the rest as "
                "requests free them)")

    def _do_restore(self, _: Any) -> str:
        self._reserve.target = 0
        self._reserve.release(self.engine)
        return f"the class has the whole pool again ({self.engine.pool_size()} blocks)"

    def _set_prefix(self, on: bool) -> str:
        # an operation like any other (in the op log): blocks cached so far keep their hash
        self.engine.apply(ops.SetPrefixCaching(on))
        self.prefix_caching = on
        return f"prefix caching {'on' if on else 'off'} for new requests"

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._publish()
            self._wake.notify()

    # ---- the engine loop -----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self.closed and (self.paused or not self.engine.has_pending_work()):
                    if time.monotonic() - self._last_activity > self.idle_seconds:
                        self.closed = True
                        self.error = f"closed after {self.idle_seconds:.0f} s without activity"
                        self._publish()
                        break
                    self._wake.wait(timeout=min(5.0, self.idle_seconds))
                if self.closed:
                    break
                self._step()
                self._publish()
            time.sleep(0.002)  # let a waiting submission or teacher action take the lock
        self.engine = None  # type: ignore[assignment]  (the KV pool goes now, not at the next GC)
        lesson, self.lesson = self.lesson, None  # closed idle: the lesson's engine goes too
        if lesson is not None:
            lesson.close()
        if self._on_close is not None:
            self._on_close(self)

    def _step(self) -> None:
        try:
            result = self.engine.apply(ops.Step())
        except Exception as err:  # a bug: the room pauses and says so instead of dying silently
            traceback.print_exc(file=sys.stderr)
            self.paused = True
            self.error = f"the engine failed ({type(err).__name__}: {err}); the room is paused"
            return
        self._touch()
        now = time.monotonic()
        for out in [*result.outputs, *result.finished]:
            rec = self.requests.get(self._id_base + out.request_id)
            if rec is None:
                continue
            first = out.outputs[0] if out.outputs else None
            if first is not None:
                rec.text = first.text
                if first.token_ids and rec.first_token_at is None:
                    rec.first_token_at = now
            rec.preemptions = out.num_preemptions
            if out.finished:
                rec.status, rec.finished_at, rec.blocks = "done", now, ()
                rec.finish_reason = first.finish_reason if first else "abort"
                if first is not None and first.finish_reason == "eos":  # the end mark is no text
                    rec.text = self._tokenizer.decode(list(first.token_ids[:-1]))
        self._reserve.top_up(self.engine)

    # ---- sizes -------------------------------------------------------------------------------

    def _blocks_for(self, prompt_tokens: int) -> int:
        return -(-(prompt_tokens + self.settings.max_tokens) // self.settings.block_size)

    def _least_usable(self) -> int:
        live = [self._blocks_for(r.prompt_tokens) for r in self.requests.values() if r.status != "done"]
        return max([2, *live])

    def _usable_blocks(self) -> int:
        return self._reserve.usable(self.engine)

    # ---- what others read ----------------------------------------------------------------------

    def _touch(self) -> None:
        self._last_activity = time.monotonic()

    def _publish(self) -> None:
        """Refresh the requests' places and publish a new RoomView (under the lock)."""
        eng = self.engine
        labels: dict[int, str] = {}
        queues: dict[str, list[int]] = {"waiting": [], "running": [], "preempted": []}
        for req in eng.requests():  # queue order: first come, first served
            rec = self.requests.get(self._id_base + req.request_id)
            if rec is None:
                continue
            place = req.status
            rec.swapped = place == "swapped"
            rec.status = "preempted" if place == "swapped" or (
                place == "waiting" and req.num_preemptions) else place
            queues[rec.status].append(rec.request_id)
            rec.blocks = req.block_ids if place == "running" else ()
            for s in req.live_seq_ids:
                labels[s] = f"{rec.student} · #{rec.request_id}"
        snap = eng.snapshot()
        m = snap.metrics
        state = {
            "code": self.code, "model": self.settings.model, "paused": self.paused,
            "closed": self.closed, "error": self.error, "step": eng.current_step(),
            "requests": [r.public() for r in self.requests.values()],
            "queues": queues, "students": len(self._students),
            "num_blocks": snap.num_blocks, "usable_blocks": self._usable_blocks(),
            "reserved_blocks": self._reserve.blocks(eng), "used_blocks": m.used_blocks,
            "cached_blocks": m.cached_blocks, "free_blocks": m.free_blocks,
            "prefix_hit_blocks": m.prefix_hit_blocks, "preemptions": m.extra["preemptions"],
            "cow_copies": m.cow_copies, "evictions": m.evictions, "prefix_caching": self.prefix_caching,
            "system_prompt": self.settings.system_prompt, "settings": self.settings.to_dict(),
        }
        events = tuple(eng.last_step.events) if eng.last_step else ()
        reserved = self._reserve.block_ids(eng)
        # one point per serving step, stamped with that step: the reserve's top-up after it
        # moves the snapshot's step on, and a later publish (a click) must not add it again
        step = eng.last_step.step if eng.last_step is not None else None
        if step is not None and (not self._memory or self._memory[-1].step != step):
            self._memory = self._memory[-MAX_POINTS + 1:] + [memory_point(snap, events)._replace(step=step)]
        names = {rid - self._id_base: f"{r.student} #{rid}" for rid, r in self.requests.items()}
        self.view = RoomView(state, snap, events, labels, self._tokenizer.decode, reserved,
                             eng.request_timeline(), tuple(self._memory),
                             self._reserve.hidden_from(eng.prefix_tree(snap), eng),
                             names)
