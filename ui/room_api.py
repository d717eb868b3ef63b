"""The room API for outside checks and scripts (gradio_client): `/room_open`, `/room_submit`,
`/room_state`, `/room_control`, and a lesson's poll: `/room_lesson` (the teacher), `/room_answer`
(a student), `/room_poll` (who answered what: the teacher). The pages call the same functions.

A student is the browser session (or gradio_client Client) that calls: Gradio's session hash, so
limits per student hold without accounts. A RoomError becomes a gr.Error whose message the
caller sees; anything else is a bug, logged, and answered with a sentence, never a traceback.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import gradio as gr

from classroom import RoomError, RoomRegistry
from ui.refusal import failed, refused


def room_errors(fn: Callable) -> Callable:
    @functools.wraps(fn)  # keeps the signature: gr.api reads its types, Gradio its gr.Request
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RoomError as err:
            raise refused(fn.__name__, str(err)) from err
        except gr.Error:
            raise
        except Exception as err:
            traceback.print_exc(file=sys.stderr)
            raise failed(f"something went wrong in the room ({type(err).__name__}); please report "
                         "this") from err
    return wrapped


def student_key(request: gr.Request | None) -> str:
    return (getattr(request, "session_hash", None) or "anonymous") if request is not None else "anonymous"


def student_link(request: gr.Request | None, code: str) -> str:
    """The link students open: PAGEDLAB_PUBLIC_URL when set, else this server's address as the
    teacher's browser reached it."""
    base = os.environ.get("PAGEDLAB_PUBLIC_URL", "").strip().rstrip("/")
    if base:
        return f"{base}/room?code={code}"
    headers = getattr(request, "headers", None) or {}
    host = headers.get("x-forwarded-host") or headers.get("host") or "127.0.0.1:7860"
    proto = headers.get("x-forwarded-proto") or "http"
    return f"{proto}://{host}/room?code={code}"


def add_room_api(registry: RoomRegistry) -> None:
    """Register the endpoints (inside a Blocks context)."""

    @room_errors
    def room_open(settings: str, request: gr.Request) -> dict:
        """Open a room. settings: JSON object (model: default | tiny-random | tiny-hybrid | dry, block_size,
        num_blocks, swap_blocks, system_prompt, max_tokens, max_students, requests_per_student,
        max_prompt_chars). Returns {code, secret, link}."""
        room = registry.open(settings)
        return {"code": room.code, "secret": room.secret, "link": student_link(request, room.code)}

    @room_errors
    def room_submit(code: str, prompt: str, request: gr.Request) -> int:
        """Send a prompt to a room as one student; returns the request's id in the room."""
        return registry.get(code).submit(student_key(request), prompt)

    @room_errors
    def room_state(code: str) -> dict:
        """A room's state: requests (id, student, status, text, blocks, ...), queues, pool usage,
        prefix_hit_blocks, preemptions; poll: the lesson the teacher plays (its page, the open
        question and how many answered, the engine's answer and the class's counts once
        revealed; never names), or null."""
        room = registry.get(code)
        lesson = room.lesson
        return {**room.view.state, "poll": None if lesson is None else lesson.view.public()}

    @room_errors
    def room_answer(code: str, answer: str, name: str = "", request: gr.Request = None) -> str:
        """Answer the open question of the lesson the teacher plays, as one student (a new answer
        replaces this student's until the teacher's Next); returns the answer as counted."""
        return registry.get(code).answer(student_key(request), answer, name)

    @room_errors
    def room_lesson(code: str, secret: str, action: str, lesson: str = "") -> str:
        """The teacher plays a lesson in the room: play (lesson: its file name without .md, e.g.
        03_fork_cow) | next (closes the open question: the engine answers) | end. Needs the
        room's secret."""
        return registry.get(code).lesson_control(secret, action, lesson)

    @room_errors
    def room_poll(code: str, secret: str) -> list:
        """Who answered what to the question on screen (student, answer, right): the teacher's
        eyes only, so it needs the room's secret."""
        return registry.get(code).poll_answers(secret)

    @room_errors
    def room_control(code: str, secret: str, action: str, value: float = 0) -> str:
        """The teacher's actions: pause | resume | step | clear | shrink (value: blocks left to
        the class) | restore | prefix_on | prefix_off | close. Needs the room's secret."""
        return registry.get(code).control(secret, action, value)

    # Light calls (a lock held for microseconds, or none): many students at once need no queue.
    for fn in (room_submit, room_state, room_answer, room_poll):
        gr.api(fn, api_name=fn.__name__, concurrency_limit=None)
    for fn in (room_open, room_control, room_lesson):
        gr.api(fn, api_name=fn.__name__, concurrency_limit=4)
