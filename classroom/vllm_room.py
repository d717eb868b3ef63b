"""A classroom room served by vLLM: the students' prompts go to a real vLLM server (the lab's:
engine/vllm/lab.py, e.g. a GPU box's named by --vllm-events and --vllm-url), each a chat turn
after the room's system prompt, and the room's picture is that server's prefix cache, folded from
its KV events. This is how a class of hundreds runs on one GPU server: vLLM schedules, PagedLab
draws.

The room keeps the same records as a PagedLab room (RoomRequest, a published RoomView), so the
teacher's and the students' pages and the API read it alike. What vLLM owns is not the room's to
change: Pause, Step, Shrink pool and the prefix cache switch act on PagedLab's engine, and are
refused here with a sentence; Clear forgets the room's requests (and empties vLLM's prefix cache
when the server allows it: the local one does). A thread follows the events and publishes; a few
threads send the prompts, so no student waits on another's answer.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from classroom.records import RoomRequest, RoomView
from classroom.settings import RoomError, RoomSettings, check_text
from engine.vllm.lab import LabServer
from engine.vllm.openai_client import VllmApiError
from engine.vllm.watch import VllmWatch

#: prompts on their way to vLLM at once from one room (vLLM batches them; more only queue here)
SENDERS = 8
NOT_HERE = ("a room served by vLLM cannot {what}: vLLM schedules its own steps and owns its "
            "pool, and its events show only what it stored and removed")


class VllmRoom:
    lesson = None  # a lesson plays on PagedLab's engine, not in a room served by vLLM

    def __init__(self, code: str, secret: str, settings: RoomSettings, server: LabServer,
                 idle_seconds: float = 1800, on_close: Callable[[Any], None] | None = None) -> None:
        self.code, self.secret, self.settings, self.server = code, secret, settings, server
        self.client = server.client()
        try:
            self.watch = VllmWatch(server.events, server.replay, silence_s=30)
        except ValueError as err:
            raise RoomError(f"the room cannot watch vLLM's events: {err}") from err
        self.idle_seconds, self._on_close = idle_seconds, on_close
        self._lock = threading.Lock()
        self.requests: dict[int, RoomRequest] = {}
        self._students: dict[str, str] = {}
        self._sent: dict[str, int] = {}
        self._next_id = 0
        self.closed, self.error = False, ""
        self._last_activity = time.monotonic()
        self._senders = ThreadPoolExecutor(SENDERS, thread_name_prefix=f"room-{code}-vllm")
        self._watched = self._read_watch()
        self._publish()
        self._thread = threading.Thread(target=self._follow, name=f"room-{code}-events", daemon=True)
        self._thread.start()

    # ---- students ------------------------------------------------------------------------------

    def submit(self, student_key: str, prompt: Any, name: str = "") -> int:
        """A student's prompt, sent to vLLM as a chat turn after the room's system prompt; the
        room's id of the request."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise RoomError("type a prompt first")
        s = self.settings
        if len(prompt) > s.max_prompt_chars:
            raise RoomError(f"the prompt has {len(prompt)} characters; this room takes at most "
                            f"{s.max_prompt_chars}")
        check_text(prompt, "the prompt")
        with self._lock:
            if self.closed:
                raise RoomError("this room is closed")
            if student_key not in self._students and len(self._students) >= s.max_students:
                raise RoomError(f"this room is full ({s.max_students} students)")
            if self._sent.get(student_key, 0) >= s.requests_per_student:
                raise RoomError(f"you sent {s.requests_per_student} requests, the most this room "
                                f"allows each student")
            label = self._students.setdefault(student_key, (name or "").strip()[:24]
                                              or f"student {len(self._students) + 1}")
            self._sent[student_key] = self._sent.get(student_key, 0) + 1
            rid, self._next_id = self._next_id, self._next_id + 1
            rec = RoomRequest(rid, label, prompt.strip(), 0, time.monotonic(), status="running")
            self.requests[rid] = rec
            self._last_activity = time.monotonic()
            self._publish()
        self._senders.submit(self._answer, rec)
        return rid

    def _answer(self, rec: RoomRequest) -> None:
        try:
            got = self.client.chat(rec.prompt, self.settings.system_prompt, self.settings.max_tokens)
            done = {"text": got.text, "prompt_tokens": got.prompt_tokens,
                    "finish_reason": got.finish_reason}
        except VllmApiError as err:
            done = {"text": f"vLLM did not answer: {err}", "finish_reason": "error"}
        with self._lock:
            for k, v in done.items():
                setattr(rec, k, v)
            rec.status, rec.finished_at = "done", time.monotonic()
            self._publish()

    def cleared(self, room_id: int) -> bool:
        return room_id not in self.requests

    def answer(self, student_key: str, raw: Any, name: str = "") -> str:
        raise RoomError(NOT_HERE.format(what="play a lesson's questions"))

    def poll_answers(self, secret: Any) -> list[dict[str, Any]]:
        return []

    # ---- the teacher ---------------------------------------------------------------------------

    def check_secret(self, secret: Any) -> None:
        if not isinstance(secret, str) or not hmac.compare_digest(secret, self.secret):
            raise RoomError("only the teacher who opened this room can do that (wrong secret)")

    def control(self, secret: Any, action: Any, value: Any = None) -> str:
        self.check_secret(secret)
        if action == "close":
            self.close()
            return "the room is closed"
        if action == "clear":
            with self._lock:
                self.requests.clear()
                self._sent.clear()
                self._publish()
            try:
                self.client.reset_prefix_cache()
                return "the room's requests are cleared, and vLLM's prefix cache is empty"
            except VllmApiError as err:
                return f"the room's requests are cleared; vLLM kept its prefix cache ({err})"
        raise RoomError(NOT_HERE.format(what=f"{action}"))

    def lesson_control(self, secret: Any, action: Any, value: Any = "") -> str:
        self.check_secret(secret)
        raise RoomError(NOT_HERE.format(what="play a lesson (open a PagedLab room for that)"))

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._publish()
        self._senders.shutdown(wait=False, cancel_futures=True)
        if self._on_close is not None:
            self._on_close(self)

    # ---- vLLM's events -------------------------------------------------------------------------

    def _follow(self) -> None:
        """Read vLLM's events (this thread alone reads the watch), publish when something came;
        close the room after idle_seconds without a prompt."""
        while not self.closed:
            got = self.watch.poll(0.2)
            seen = self._read_watch() if got or len(self.watch.problems) != self._watched[4] else None
            with self._lock:
                if seen is not None:
                    self._watched = seen
                    self._publish()
                if time.monotonic() - self._last_activity > self.idle_seconds:
                    self.error = "closed after a while without a prompt"
            if self.error:
                self.close()
        self.watch.close()

    def _read_watch(self) -> tuple:
        """What the view shows of the watch: (tree, counts, status, last message, problems)."""
        w = self.watch
        return (w.tree(), w.counts(), w.status(), w.last_seq, len(w.problems),
                [p.message for p in list(w.problems)[-3:]])

    def _publish(self) -> None:
        """A new RoomView (under the lock): the requests, vLLM's cache as a tree, its counts."""
        tree, c, status, last, _, problems = self._watched
        running = [r.request_id for r in self.requests.values() if r.status == "running"]
        state = {
            "code": self.code, "served_by": "vllm", "vllm": self.server.url,
            "model": self.server.model or "vLLM", "paused": False, "closed": self.closed,
            "error": self.error, "step": last, "students": len(self._students),
            "requests": [r.public() for r in self.requests.values()],
            "queues": {"waiting": [], "running": running, "preempted": []},
            "vllm_blocks": c.blocks, "vllm_stored": c.stored, "vllm_removed": c.removed,
            "watch": status, "problems": problems,
            "system_prompt": self.settings.system_prompt, "settings": self.settings.to_dict(),
        }
        self.view = RoomView(state, tree=tree)
