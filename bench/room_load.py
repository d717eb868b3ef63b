"""A classroom at once: one room of N students (gradio_client threads) on `python app.py` with the
real default model. Run through `python bench/load.py --room-students 60`.

The teacher opens a room through `/room_open` (a shared system prompt; short answers). Every
student connects, then all send one prompt at the same moment through `/room_submit`, and each
polls `/room_state` once a second, as the student page's timer does, until its answer is done.
Reported per request: time to first token and to finish, p50 / p95 / max, both as the room
measured them (from the submission to the step that produced the token) and as the student saw
them (from pressing Send to the poll that showed it: includes the submit call and the polling
interval). Also: errors, the room's prefix hits and preemptions, the server's CPU seconds and
memory (RSS at start, peak during, end). The students are threads of this process on the same
cores as the server.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from bench.measure import RssSampler, pct, rss_mb

SYSTEM = "You are a friendly tutor. Answer in one short sentence."
TOPICS = ["the moon", "volcanoes", "bees", "rainbows", "the ocean", "trees", "music", "numbers",
          "clouds", "the sun", "fish", "snow"]


@dataclass
class Student:
    index: int
    request_id: int | None = None
    first_token_s: float | None = None  # as this student saw it
    finish_s: float | None = None
    text: str = ""
    errors: list[str] = field(default_factory=list)


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    return {"count": len(values), "p50_s": round(statistics.median(values), 2),
            "p95_s": round(pct(values, 0.95), 2), "max_s": round(max(values), 2)}


def student(url: str, code: str, s: Student, start: threading.Barrier, poll_s: float,
            timeout_s: float) -> None:
    from gradio_client import Client

    try:
        client = Client(url, verbose=False, httpx_kwargs={"timeout": 300})
    except Exception as err:  # noqa: BLE001 (a refused connection is an error of the run)
        s.errors.append(f"connect: {type(err).__name__}: {err}")
        start.abort()
        return
    try:
        start.wait()
        t0 = time.perf_counter()
        prompt = f"Tell me one fact about {TOPICS[s.index % len(TOPICS)]} (student {s.index})."
        s.request_id = client.predict(code, prompt, api_name="/room_submit")
        while time.perf_counter() - t0 < timeout_s:
            state = client.predict(code, api_name="/room_state")
            mine = next((r for r in state["requests"] if r["id"] == s.request_id), None)
            now = time.perf_counter() - t0
            if mine is not None and mine["text"] and s.first_token_s is None:
                s.first_token_s = now
            if mine is not None and mine["status"] == "done":
                s.finish_s, s.text = now, mine["text"]
                s.first_token_s = s.first_token_s or now
                return
            time.sleep(poll_s)
        s.errors.append(f"not done after {timeout_s} s")
    except Exception as err:  # noqa: BLE001
        s.errors.append(f"{type(err).__name__}: {err}")
    finally:
        client.close()


def run_room(url: str, pid: int, n_students: int, max_tokens: int = 16, poll_s: float = 1.0,
             timeout_s: float = 900) -> dict[str, Any]:
    from gradio_client import Client

    teacher = Client(url, verbose=False, httpx_kwargs={"timeout": 300})
    settings = {"system_prompt": SYSTEM, "max_tokens": max_tokens, "block_size": 16, "num_blocks": 64,
                "swap_blocks": 32, "max_students": max(n_students, 1)}
    room = teacher.predict(json.dumps(settings), api_name="/room_open")
    rss_start = rss_mb(pid)
    students = [Student(i) for i in range(n_students)]
    start = threading.Barrier(n_students)
    threads = [threading.Thread(target=student, args=(url, room["code"], s, start, poll_s, timeout_s))
               for s in students]
    sampler = RssSampler(pid)
    sampler.start()
    load0 = os.getloadavg()[0]
    cpu0 = psutil.Process(pid).cpu_times()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu1 = psutil.Process(pid).cpu_times()
    load1 = os.getloadavg()[0]
    sampler.stop_flag.set()
    state = teacher.predict(room["code"], api_name="/room_state")
    teacher.predict(room["code"], room["secret"], "close", api_name="/room_control")
    errors = [f"student {s.index}: {e}" for s in students for e in s.errors]
    by_id = {r["id"]: r for r in state["requests"]}
    mine = [by_id[s.request_id] for s in students if s.request_id in by_id]
    return {
        "what": "bench/room_load.py: one classroom room, every student sends one prompt at once "
                "(gradio_client threads) and polls /room_state every second until done",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(),
                    "note": ("the students (gradio_client threads polling once a second) run on the same "
                             "cores as the server; see load_average_start_end"),
                    # runnable tasks on the machine (1-minute average) as the students started and
                    # ended: above 2, the server got only a share of the two cores
                    "load_average_start_end": [round(load0, 1), round(load1, 1)]},
        "room": {**settings, "model": "default (SmolLM2-135M, CPU, float32)"},
        "students": n_students,
        "seconds_until_every_answer_was_done": round(wall, 1),
        "errors": len(errors),
        "error_samples": errors[:10],
        "answers_done": sum(1 for r in mine if r["status"] == "done"),
        "empty_answers": sum(1 for r in mine if not r["text"].strip()),
        "room_measured": {
            "time_to_first_token": summary([r["time_to_first_token_s"] for r in mine
                                            if r["time_to_first_token_s"] is not None]),
            "time_to_finish": summary([r["time_to_finish_s"] for r in mine
                                       if r["time_to_finish_s"] is not None]),
        },
        "student_saw": {
            "time_to_first_token": summary([s.first_token_s for s in students if s.first_token_s]),
            "time_to_finish": summary([s.finish_s for s in students if s.finish_s]),
        },
        "engine": {k: state[k] for k in ("step", "prefix_hit_blocks", "preemptions", "evictions",
                                         "num_blocks")},
        "server_cpu_seconds": round((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system), 1),
        "server_cpu_cores_busy": round(((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)) / wall, 2),
        "rss_mib": {"at_start": round(rss_start, 1), "peak_during": round(sampler.peak / 2**20, 1),
                    "end": round(rss_mb(pid), 1)},
    }
