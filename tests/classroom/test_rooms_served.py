"""Classroom rooms on the served app (`python app.py`, real default model): STUDENTS gradio_client
students at once in one room with a small pool (every request finishes with its own text, the
shared system prompt's blocks are prefix hits, the pool preempts), a student cannot control the
room, two rooms do not see each other; then the student page in a 390 px browser and the
projector view (conditions awaited, never fixed sleeps). With PAGEDLAB_UPDATE_SCREENSHOTS=1 the
projector screenshot goes to docs/ for the README."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.helpers import at_once, open_room_page
from ui.app_process import ROOT

pytestmark = pytest.mark.slow  # the served app on the real model, several clients, a browser
# students at once: enough for a room that must preempt and a poll with three answers; a class of
# 60 under load is bench/room_load.py's (`bench/load.py --room-students`), not a test's
STUDENTS = 8
RIGHT = STUDENTS - 3  # the poll: students 0 .. RIGHT - 1 answer right; student 0 then changes
SYSTEM = "You are a friendly tutor. Answer in one short sentence."
SHOTS = os.path.join(ROOT, "docs") if os.environ.get("PAGEDLAB_UPDATE_SCREENSHOTS") else "/tmp"


def client(url: str):
    from gradio_client import Client

    # a generous timeout: the 2-core machine runs the model and the clients at once
    return Client(url, verbose=False, httpx_kwargs={"timeout": 120})


def wait_state(c, code: str, cond, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = c.predict(code, api_name="/room_state")
        if cond(state):
            return state
        assert time.monotonic() < deadline, f"room state never reached the condition: {state}"
        time.sleep(0.3)


def test_a_class_of_students_shares_one_engine(served_app, default_model):
    teacher = client(served_app)
    # 36-token prompts at block size 8: the system prompt's two full blocks are shared, each
    # request holds three more and needs a sixth while decoding; 20 blocks cannot hold everyone
    room = teacher.predict(json.dumps({"system_prompt": SYSTEM, "max_tokens": 8, "block_size": 8,
                                       "num_blocks": 20, "swap_blocks": 6}), api_name="/room_open")
    assert set(room) >= {"code", "secret", "link"} and room["link"].endswith(f"/room?code={room['code']}")
    code = room["code"]
    sent: dict[int, str] = {}

    def student(i: int, start) -> None:
        c = client(served_app)
        start.wait()  # every client connected: now all of them send at once
        prompt = f"What is {i} plus {i}?"
        sent[c.predict(code, prompt, api_name="/room_submit")] = prompt
        c.close()

    assert at_once(STUDENTS, student) == [] and len(sent) == STUDENTS
    state = wait_state(teacher, code, lambda s: all(r["status"] == "done" for r in s["requests"]))
    by_id = {r["id"]: r for r in state["requests"]}
    assert sorted(by_id) == sorted(sent) == list(range(STUDENTS))
    for rid, prompt in sent.items():  # each student's id leads to that student's own request
        assert by_id[rid]["prompt"] == prompt and by_id[rid]["text"].strip()
    assert state["students"] == STUDENTS
    # the system prompt's full blocks are computed once and then shared
    assert state["prefix_hit_blocks"] >= STUDENTS - 1
    assert state["preemptions"] > 0 and any(r["preemptions"] for r in state["requests"])
    # a request's text is what the model says to that prompt alone (no cross-talk, preempted or not)
    from engine import EngineConfig, LLMEngine, SamplingParams

    alone = LLMEngine(EngineConfig(model="default", device="cpu", block_size=8, num_gpu_blocks=16))
    hf = alone.tokenizer.hf
    for r in sorted(state["requests"], key=lambda r: -r["preemptions"])[:3]:
        ids = hf.apply_chat_template([{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": r["prompt"]}],
                                     add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        out = alone.generate([ids], SamplingParams(max_tokens=8))[0].outputs[0]
        tokens = out.token_ids[:-1] if out.finish_reason == "eos" else out.token_ids
        assert r["text"] == alone.decode(list(tokens)), r


def test_a_student_cannot_control_and_rooms_do_not_see_each_other(served_app):
    from gradio_client.exceptions import AppError

    teacher, student = client(served_app), client(served_app)
    a = teacher.predict(json.dumps({"model": "dry", "block_size": 4, "max_tokens": 4}), api_name="/room_open")
    b = teacher.predict('{"model": "dry", "block_size": 4, "max_tokens": 4}', api_name="/room_open")
    rid = student.predict(a["code"], "only for room a", api_name="/room_submit")
    wait_state(teacher, a["code"], lambda s: s["requests"] and s["requests"][0]["status"] == "done")
    assert teacher.predict(b["code"], api_name="/room_state")["requests"] == []
    for secret in ("", "guess", b["secret"]):
        with pytest.raises(AppError, match="only the teacher"):
            student.predict(a["code"], secret, "clear", api_name="/room_control")
    assert teacher.predict(a["code"], api_name="/room_state")["requests"][0]["id"] == rid
    assert "paused" in teacher.predict(a["code"], a["secret"], "pause", api_name="/room_control")
    # an ordinary session beside the rooms has its own engine: neither sees the other
    out = student.predict("Hello", False, api_name="/on_new")
    assert "operation 1 of 1" in out[-1] and "only for room a" not in str(out)
    assert len(teacher.predict(a["code"], api_name="/room_state")["requests"]) == 1
    with pytest.raises(AppError, match="no open room"):
        student.predict("ZZZZZZ", "hello", api_name="/room_submit")
    for room in (a, b):
        teacher.predict(room["code"], room["secret"], "close", api_name="/room_control")


def test_a_class_answers_a_poll_and_the_projector_counts_them(served_app, default_model):
    """Issue 35's poll through the API: the teacher plays lesson 2 in a room; STUDENTS gradio_client
    students answer its first question at once (one changes their answer); the counts the
    projector shows equal the answers sent, the changed one counted once; Next reveals the
    engine's answer; a student can neither reveal nor read who answered what."""
    from gradio_client.exceptions import AppError

    teacher = client(served_app)
    room = teacher.predict(json.dumps({"model": "dry"}), api_name="/room_open")
    code, secret = room["code"], room["secret"]
    teacher.predict(code, secret, "play", "02_paging", api_name="/room_lesson")
    teacher.predict(code, secret, "next", "", api_name="/room_lesson")  # page 1 asks: how many blocks?
    question = teacher.predict(code, api_name="/room_state")["poll"]["question"]
    assert question["kind"] == "number"
    students: dict[int, object] = {}

    def student(i: int, start) -> None:
        c = students[i] = client(served_app)
        start.wait()  # all at once
        said = c.predict(code, "2" if i < RIGHT else "3 blocks", f"Student {i}", api_name="/room_answer")
        assert said in ("2 blocks", "3 blocks"), said

    assert at_once(STUDENTS, student) == []
    assert students[0].predict(code, "5", "Student 0", api_name="/room_answer") == "5 blocks"  # changed
    poll = wait_state(teacher, code, lambda s: s["poll"]["answered"] == STUDENTS)["poll"]
    assert poll["question"] == question and poll["reveal"] is None
    state = json.dumps(students[7].predict(code, api_name="/room_state"))
    assert "Student" not in state  # counts, never names
    for secret_guess in ("", "guess"):
        with pytest.raises(AppError, match="only the teacher"):
            students[7].predict(code, secret_guess, "next", "", api_name="/room_lesson")
        with pytest.raises(AppError, match="only the teacher"):
            students[7].predict(code, secret_guess, api_name="/room_poll")
    assert teacher.predict(code, api_name="/room_state")["poll"]["reveal"] is None  # still open
    said = teacher.predict(code, secret, "next", "", api_name="/room_lesson")
    reveal = teacher.predict(code, api_name="/room_state")["poll"]["reveal"]
    assert reveal["answer"] == "2 blocks" and "2 blocks" in said
    assert {c["answer"]: c["students"] for c in reveal["counts"]} == {
        "2 blocks": RIGHT - 1, "3 blocks": STUDENTS - RIGHT, "5 blocks": 1}
    assert reveal["right"] == RIGHT - 1 and reveal["answered"] == STUDENTS
    who = teacher.predict(code, secret, api_name="/room_poll")  # the teacher's eyes only
    assert len(who) == STUDENTS and {w["student"] for w in who} == {f"Student {i}" for i in range(STUDENTS)}
    assert sum(w["right"] for w in who) == RIGHT - 1
    for c in students.values():
        c.close()
    teacher.predict(code, secret, "close", api_name="/room_control")


def test_the_room_bench_runs(served_app):
    """bench/room_load.py in small (3 students), so `bench/load.py --room-students` cannot rot; the
    CPU and memory figures here are this test process's, not the server's."""
    from bench.room_load import run_room

    result = run_room(served_app, os.getpid(), 3, max_tokens=4, poll_s=0.3, timeout_s=120)
    assert result["errors"] == 0 and result["answers_done"] == 3 and result["empty_answers"] == 0
    assert result["room_measured"]["time_to_finish"]["count"] == 3
    assert result["student_saw"]["time_to_first_token"]["p50_s"] > 0


def test_projector_and_a_phone_in_one_room(served_app, browser):
    projector = browser.new_page(viewport={"width": 1440, "height": 900})
    errors: list[str] = []
    projector.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    projector.goto(served_app + "class")
    projector.locator("#room-open").click()
    projector.wait_for_function(
        "() => document.querySelector('#room-code input, #room-code textarea')?.value.length === 6",
        timeout=60_000)
    code = projector.locator("#room-code input, #room-code textarea").first.input_value()
    secret = projector.locator("#room-secret input").first.input_value()
    assert len(secret) > 16
    link = projector.locator("#room-joined a").first.get_attribute("href")
    assert link.endswith(f"/room?code={code}")

    # a phone opens the link: the code is filled in, Send streams the answer in
    phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    phone.goto(link)
    phone.wait_for_function(
        "(c) => document.querySelector('#student-code textarea, #student-code input')?.value === c",
        arg=code, timeout=60_000)
    phone.locator("#student-prompt textarea").fill("Why is the sky blue?")
    phone.locator("#student-send").click()
    # a student who sends and closes the tab at once loses nothing: the room keeps the request
    gone = browser.new_page(viewport={"width": 390, "height": 844})
    gone.goto(link)
    gone.wait_for_function("(c) => document.querySelector('#student-code textarea, #student-code input')"
                           "?.value === c", arg=code, timeout=60_000)
    gone.locator("#student-prompt textarea").fill("What do bees make?")
    gone.locator("#student-send").click()
    gone.wait_for_function("() => document.querySelector('#student-mine')?.innerText.includes('bees')",
                           timeout=60_000)
    gone.close()
    # meanwhile the rest of the class sends theirs, through the API
    others = [client(served_app) for _ in range(5)]
    for i, c in enumerate(others):
        c.predict(code, f"Name a colour number {i}.", api_name="/room_submit")
    phone.wait_for_function("() => /running|waiting|preempted|done/.test("
                            "document.querySelector('#student-mine')?.innerText || '')", timeout=60_000)
    projector.wait_for_function(
        "() => document.querySelector('#room-queues')?.innerText.includes('student')"
        " && document.querySelector('#room-plot .main-svg')", timeout=60_000)
    projector.wait_for_function("() => /running\\s*[1-9]/.test("
                                "document.querySelector('#room-queues')?.innerText || '')", timeout=60_000)
    os.makedirs(SHOTS, exist_ok=True)
    projector.screenshot(path=os.path.join(SHOTS, "classroom-projector.png"))
    phone.wait_for_function("() => document.querySelector('#student-mine')?.innerText.includes('done')",
                            timeout=120_000)
    mine = phone.locator("#student-mine").inner_text()
    assert phone.locator("#student-pool span").count() == 64  # the whole pool, theirs in colour
    assert "Why is the sky blue?" in mine and "Name a colour" not in mine  # only their own request
    # the phone's page fits its 390 px screen: nothing to scroll sideways
    assert phone.evaluate("() => document.documentElement.scrollWidth") <= 390
    phone.screenshot(path=os.path.join(SHOTS, "classroom-student.png"))
    projector.wait_for_function("() => document.querySelector('#room-requests-box')?.innerText"
                                ".includes('Why is the sky blue?')", timeout=60_000)
    wait_state(client(served_app), code, lambda st: any(
        r["prompt"] == "What do bees make?" and r["status"] == "done" and r["text"] for r in st["requests"]))
    # the teacher pauses from the projector page: the state says so
    projector.locator("#room-pause").click()
    projector.wait_for_function("() => document.querySelector('#room-said')?.innerText.includes('paused')",
                                timeout=30_000)
    assert client(served_app).predict(code, api_name="/room_state")["paused"] is True
    # the teacher shrinks the pool: one hatched region, the class's numbers apart from it
    projector.get_by_label("blocks for the class").fill("16")
    projector.locator("#room-shrink").click()
    projector.wait_for_function("() => /reserved by the teacher: \\d+ \\(of the pool's 64\\)/.test("
                                "document.querySelector('#room-metrics-box')?.innerText ?? '')",
                                timeout=60_000)
    projector.wait_for_function("() => (document.querySelector('#room-plot .js-plotly-plot')?.data"
                                " ?? []).some((t) => t.name === 'reserved by the teacher')",
                                timeout=60_000)
    assert errors == []
    projector.close()  # its room's timer would otherwise tick for the rest of the session
    phone.close()


POLL_ASK = "() => document.querySelector('#room-poll-ask')?.innerText ?? ''"
PROJECTED = ("() => { const gd = document.querySelector('#room-plot .js-plotly-plot');"
             " const f = gd?.layout?.meta?.fit; return !!f?.fitted && f.token_px >= 14"
             " && gd.getBoundingClientRect().height > 400; }")
STUDENT_POLL = "() => document.querySelector('#student-poll')?.innerText ?? ''"


def test_a_poll_on_the_projector_and_a_phone(served_app, browser, default_model):
    """Issue 35 in Chromium: the teacher plays lesson 2 in a room and projects it (1280 x 720);
    a phone answers the question; the projector counts it, Next draws the class's answers under
    the lesson's picture, the phone says whether its prediction was right."""
    teacher = browser.new_page(viewport={"width": 1280, "height": 720})
    phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    try:
        code = open_room_page(teacher, served_app)
        teacher.locator("#room-lesson input").first.fill("2. Paging: blocks and tables")
        teacher.keyboard.press("Enter")
        picked = ("() => { const i = document.querySelector('#room-lesson input');"
                  " return [i.value, i.scrollWidth <= i.clientWidth + 1]; }")
        assert teacher.evaluate(picked) == ["2. Paging: blocks and tables", True]  # its title whole
        teacher.click("#room-lesson-play")
        teacher.wait_for_function("() => (document.querySelector('#room-poll')?.innerText ?? '')"
                                  ".includes('page 0 of')", timeout=120_000)
        teacher.click("#room-lesson-next")
        teacher.wait_for_function(f"() => ({POLL_ASK})().includes('Predict')", timeout=60_000)
        phone.goto(served_app + f"room?code={code}")
        phone.wait_for_function(f"() => ({STUDENT_POLL})().includes('Predict')", timeout=60_000)
        phone.locator("#student-name input, #student-name textarea").first.fill("Ada")
        phone.locator("#student-answer input, #student-answer textarea").first.fill("2")
        phone.click("#student-answer-send")
        phone.wait_for_function(f"() => ({STUDENT_POLL})().includes('Your answer: 2 blocks')",
                                timeout=60_000)
        for i, guess in enumerate(("2", "3", "2", "4")):  # the rest of the class, by the API
            client(served_app).predict(code, guess, f"S{i}", api_name="/room_answer")
        teacher.click("#room-projector")
        teacher.wait_for_function(f"() => ({POLL_ASK})().includes('5 answered')", timeout=60_000)
        teacher.wait_for_function(PROJECTED, timeout=60_000)  # the picture redrawn for the projector
        assert "Ada" not in teacher.locator("#room-side").inner_text()  # names stay off the projector
        os.makedirs(SHOTS, exist_ok=True)
        teacher.screenshot(path=os.path.join(SHOTS, "poll-projector-question.png"))
        phone.screenshot(path=os.path.join(SHOTS, "poll-phone-question.png"))
        teacher.click("#room-lesson-next")  # the reveal: the step runs, the engine answers
        teacher.wait_for_function("() => document.querySelector('#room-view-plot .js-plotly-plot')"
                                  "?.layout?.meta?.view === 'poll'", timeout=60_000)
        meta = teacher.evaluate("document.querySelector('#room-view-plot .js-plotly-plot').layout.meta")
        assert (meta["answer"], meta["right"], meta["answered"]) == ("2 blocks", 3, 5)
        bars = teacher.evaluate("document.querySelector('#room-view-plot .js-plotly-plot').data[0]")
        assert dict(zip(bars["x"], bars["y"], strict=True)) == {"2 blocks": 3, "3 blocks": 1, "4 blocks": 1}
        pic, hist = (teacher.locator(s).first.bounding_box() for s in ("#room-plot", "#room-view-plot"))
        assert hist["y"] >= pic["y"] + pic["height"] - 2 and hist["y"] + hist["height"] <= 721
        phone.wait_for_function(f"() => ({STUDENT_POLL})().includes('You predicted 2 blocks: right')",
                                timeout=60_000)
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        teacher.screenshot(path=os.path.join(SHOTS, "poll-projector-reveal.png"))
        phone.screenshot(path=os.path.join(SHOTS, "poll-phone-reveal.png"))
    finally:
        teacher.close()
        phone.close()
