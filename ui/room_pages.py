"""The classroom pages: `/class` (the teacher opens a room, drives it, and projects it) and `/room`
(a student's minimal page: prompt, Send, the answer streaming in, where the request is).

Both pages read the room's published view (classroom/records.py) on a gr.Timer, so a page that
polls never waits for the engine; the room's own thread steps it. A student closing the tab
loses nothing: the room keeps the request and its text.
"""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from classroom import RoomError, RoomRegistry
from classroom.settings import BLOCK_SIZES, MODELS, RoomSettings
from ui.picture_box import parse_box
from ui.room_api import add_room_api, room_errors, student_key, student_link
from ui.room_poll import (
    lesson_picture,
    names_html,
    poll_markdown,
    poll_plot,
    student_part,
    student_poll,
    teacher_part,
)
from ui.room_render import metrics_html, projector_figure, qr_svg, queues_html, requests_html, student_html
from ui.run_views import VIEWS, room_view, split_box
from ui.stream_nudge import nudge_button

CLASS_PATH, ROOM_PATH = "/class", "/room"
DEFAULT_SYSTEM = "You are a friendly tutor. Answer in one short sentence."


def add_room_pages(demo: gr.Blocks, registry: RoomRegistry) -> None:
    """Add the two pages and the API to the app (call outside its `with gr.Blocks()`)."""
    with demo:
        gr.Markdown(f"**Classroom mode**: [open a room for your class]({CLASS_PATH.lstrip('/')}), "
                    "one engine on the projector, every student's request in it.", elem_id="room-link")
    with demo.route("Classroom", CLASS_PATH, show_in_navbar=False):
        _teacher_page(demo, registry)
        add_room_api(registry)
    with demo.route("Room", ROOM_PATH, show_in_navbar=False):
        _student_page(demo, registry)


def _code_from_link(request: gr.Request) -> str:
    return dict(request.query_params).get("code", "") if request else ""


def _student_code(typed: Any, request: gr.Request | None) -> str:
    """The room code in the box, else the link's: the box is filled by the page's load, and a
    phone on a busy server could send (refused: "no open room has the code ''") or answer a
    question before that arrived. A send writes the code it used back into the box."""
    typed = typed.strip() if isinstance(typed, str) else ""
    return typed or _code_from_link(request)


def _joined(code: str, request: gr.Request | None) -> tuple[str, str, str]:
    """The room's code, the student link and its QR code, for the projector; and, apart (the
    projector view hides it), the teacher's note when phones cannot reach the link."""
    link = student_link(request, code)
    text = f"### Room {code}\nOpen **[{link}]({link})** (or scan the code) and press Send."
    warning = ""
    if "//127." in link or "//localhost" in link:
        warning = ("_Phones cannot reach this address: open this page by the machine's network "
                   "address (e.g. http://192.168.1.20:7860/class), or set PAGEDLAB_PUBLIC_URL._")
    return text, qr_svg(link), warning


def _teacher_page(demo: gr.Blocks, registry: RoomRegistry) -> None:
    nudge_button()  # every page has its own: ui/stream_nudge.py
    # the projector view: the picture at presenter size, the room's link and numbers; the
    # teacher's controls, settings and notes hidden (ui/theme.py), a click away
    projector = gr.Checkbox(label="projector view (hide the teacher's controls)", elem_id="room-projector")
    # the server has nothing to do (its value back, with no output, made Gradio warn each toggle)
    projector.change(lambda _on: None, [projector], None, queue=False,
                     js="(on) => { document.body.classList.toggle('pl-projector', !!on); return on; }")
    with gr.Accordion("Open a room", open=True, elem_id="room-open-box") as open_box:
        with gr.Row():
            model = gr.Dropdown(list(MODELS), value="default", label="model")
            block_size = gr.Dropdown(list(BLOCK_SIZES), value=16, label="block size (tokens)")
            num_blocks = gr.Number(value=64, label="pool size (blocks)")
            swap = gr.Number(value=64, label="swap space (blocks)")
            max_tokens = gr.Number(value=24, label="max tokens per answer")
        with gr.Row():
            system = gr.Textbox(value=DEFAULT_SYSTEM, label="shared system prompt (every request starts "
                                "with it: watch the prefix cache share its blocks)", scale=3)
            students = gr.Number(value=80, label="students")
            each = gr.Number(value=5, label="requests per student")
            chars = gr.Number(value=300, label="prompt length (characters)")
        # the lab's vLLM answers, and the picture is its cache from its KV events (the
        # pool's settings above are then vLLM's own)
        served = gr.Checkbox(label="served by vLLM (the one in the vLLM tab, or --vllm-url)",
                             elem_id="room-vllm")
        open_btn = gr.Button("Open room", variant="primary", elem_id="room-open")
    # the projector: the picture first, the room's code and numbers beside it
    with gr.Row(elem_id="room-main"):
        with gr.Column(scale=3, elem_id="room-picture-col"):
            plot = gr.Plot(show_label=False, elem_id="room-plot")
            view_plot = gr.Plot(show_label=False, elem_id="room-view-plot", visible=False)
            view_choice = gr.Radio(list(VIEWS), value="none", label="under the picture",
                                   elem_id="room-view-choice")
            with gr.Row(elem_id="room-controls"):
                buttons = {a: gr.Button(label, elem_id=f"room-{a}", size="sm", min_width=80)
                           for a, label in (("pause", "Pause"), ("resume", "Resume"), ("step", "Step"),
                                            ("clear", "Clear room"), ("prefix_off", "Prefix cache off"),
                                            ("prefix_on", "Prefix cache on"), ("restore", "Whole pool"))}
            with gr.Row(elem_id="room-shrink-row"):
                shrink_to = gr.Number(value=32, label="blocks for the class",
                                      min_width=120)  # half the room's pool once it is open
                buttons["shrink"] = gr.Button("Shrink pool", elem_id="room-shrink", size="sm")
                said = gr.Markdown(elem_id="room-said")
        with gr.Column(scale=2, elem_id="room-side"):
            with gr.Row():
                joined = gr.Markdown(elem_id="room-joined")
                qr = gr.HTML(elem_id="room-qr")
            warning = gr.Markdown(elem_id="room-warning")
            poll = teacher_part()  # a lesson in the room: its page, question and the class's answers
            metrics = gr.HTML(elem_id="room-metrics-box")
            queues = gr.HTML(elem_id="room-queues")
    requests = gr.HTML(elem_id="room-requests-box")
    with gr.Row(elem_id="room-keys"):
        code = gr.Textbox(label="room code (to project a room opened elsewhere)", elem_id="room-code",
                          max_length=12)
        # hidden on the projector; the copy button lets the teacher keep it for another browser
        secret = gr.Textbox(label="teacher secret (keep it: it controls the room)", type="password",
                            elem_id="room-secret", max_length=64, buttons=["copy"])
    shown_step = gr.State(-1)
    timer = gr.Timer(1.0)
    box = gr.Textbox(elem_id="room-box", elem_classes=["pl-hidden"], show_label=False, container=False)

    @room_errors
    def on_open(m, bs, nb, sw, mt, sp, st, ea, ch, vl, request: gr.Request):
        room = registry.open(RoomSettings.parse({
            "model": m, "block_size": bs, "num_blocks": nb, "swap_blocks": sw, "max_tokens": mt,
            "system_prompt": sp or "", "max_students": st, "requests_per_student": ea,
            "max_prompt_chars": ch, "served_by": "vllm" if vl else "pagedlab"}))
        # "blocks for the class" starts at half this room's pool, not at a fixed number
        half = max(1, room.settings.num_blocks // 2)
        return (*_joined(room.code, request), room.code, room.secret, gr.Accordion(open=False),
                gr.update(value=half))

    def on_load(request: gr.Request):
        """/class?code=X projects a room opened elsewhere (without its secret)."""
        c = _code_from_link(request).strip().upper()
        if not c:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        return (*_joined(c, request), c, gr.Accordion(open=False))

    open_btn.click(on_open, [model, block_size, num_blocks, swap, max_tokens, system, students, each, chars,
                             served],
                   [joined, qr, warning, code, secret, open_box, shrink_to])

    def make_control(action: str):
        def on_control(c, s, value):
            """What happened, or why not, in words on the projector (a refused action changes
            nothing else); a bug still goes to the log and a message box."""
            try:
                return registry.get(c).control(s, action, value)
            except RoomError as err:
                return _not_done(err, s)
        return room_errors(on_control)

    for action, btn in buttons.items():
        btn.click(make_control(action), [code, secret, shrink_to], [said])

    def make_lesson(action: str):
        def on_lesson(c, s, name):
            try:
                return registry.get(c).lesson_control(s, action, name)
            except RoomError as err:
                return _not_done(err, s)
        return room_errors(on_lesson)

    for action, btn in poll.buttons.items():
        btn.click(make_lesson(action), [code, secret, poll.lesson], [said])

    def on_tick(c, last_step, box_value, large, choice, s):
        rest = (gr.skip(),) * 3  # the poll's panels
        try:
            room = registry.get(c) if c else None
        except RoomError as err:
            return gr.skip(), "", f"<p>{html.escape(str(err))}</p>", "", last_step, gr.skip(), *rest
        if room is None:
            return gr.skip(), "", "", "", last_step, gr.skip(), *rest
        view, lesson = room.view, room.lesson
        pv = lesson.view if lesson is not None else None
        size = parse_box(box_value)
        page = None if pv is None else (pv.lesson, pv.page, pv.reveal is not None)
        step = (view.state["step"], len(view.state["requests"]), view.state["reserved_blocks"],
                size, bool(large), choice, page)  # a new box, view or lesson page redraws too
        try:
            who = names_html(room.poll_answers(s)) if s and pv is not None else ""
        except RoomError:
            who = ""
        # while a lesson plays, the side shows its page: the room's engine's numbers step aside
        panels = (("", "") if pv is not None else (metrics_html(view), queues_html(view))) + (
            requests_html(view),)
        text, ask = poll_markdown(pv)
        if step == last_step:
            return (gr.skip(), *panels, step, gr.skip(), text, ask, who)
        if pv is None:  # the view under the picture (ui/run_views.py) takes its share of the box
            fig = projector_figure(view, split_box(size, choice)[0], bool(large))
            below = room_view(view, choice, size, bool(large))
        else:  # a lesson plays: its page's picture, and under it how the class answered
            pic_box, poll_box = split_box(size, "poll" if pv.reveal is not None else "none")
            fig = lesson_picture(pv, pic_box, bool(large))
            below = poll_plot(pv, poll_box, bool(large))
        return (fig, *panels, step, gr.update(value=below, visible=below is not None), text, ask, who)

    timer.tick(on_tick, [code, shown_step, box, projector, view_choice, secret],
               [plot, metrics, queues, requests, shown_step, view_plot, *poll.outs],
               show_progress="hidden")
    code.change(lambda: -1, None, [shown_step])
    demo.load(on_load, None, [joined, qr, warning, code, open_box])


def _not_done(err: RoomError, secret: Any) -> str:
    """A refused teacher's action, in words: on the line under the controls, and as a note that
    the projector view (which hides that line and the secret's box) shows too. A page that
    opened the room by its code has no secret: it says where to type it."""
    why = str(err)
    if not secret:
        why = ("this page has no teacher secret (a room opened elsewhere, projected by its code): "
               "untick projector view and type it in the teacher secret box to control the room here")
    gr.Warning(why, duration=15)
    return f"**Not done:** {why}"


def _student_page(demo: gr.Blocks, registry: RoomRegistry) -> None:
    gr.Markdown("# PagedLab classroom")
    nudge_button()
    code = gr.Textbox(label="room code", elem_id="student-code", max_length=12)
    name = gr.Textbox(label="your name (optional)", elem_id="student-name", max_length=24)
    _student_poll(registry, code, name)  # a lesson's question first, when the teacher plays one
    # no max_length: the room refuses a prompt over its limit with the real count, never cut it
    prompt = gr.Textbox(label="your prompt", elem_id="student-prompt", lines=2)
    send = gr.Button("Send", variant="primary", elem_id="student-send")
    mine_html = gr.HTML(elem_id="student-mine")
    mine = gr.State([])
    timer = gr.Timer(0.7, active=False)

    @room_errors
    def on_send(c, n, p, ids, request: gr.Request):
        room = registry.get(_student_code(c, request))
        rid = room.submit(student_key(request), p, n)
        ids = [*ids, rid]
        # the box shows the room the request went to (the link's, when it was still empty)
        return ids, student_html(room.view, ids, False), gr.Timer(active=True), "", room.code

    def on_tick(c, ids):  # the send that started it filled the box
        try:
            room = registry.get(c)
        except RoomError as err:
            return f"<p>{html.escape(str(err))}</p>", gr.Timer(active=False)
        view = room.view
        cleared = any(room.cleared(i) for i in ids)
        live = {r["id"]: r["status"] for r in view.state["requests"]}
        # a request not in the published view yet (sent a moment ago) is still on its way: the
        # page keeps polling (it stopped here once, and the student never saw the answer)
        waiting = any(live.get(i) != "done" and not room.cleared(i) for i in ids)
        return student_html(view, ids, cleared), gr.Timer(active=waiting and not view.state["closed"])

    # no progress on the outputs: a refused send (an empty prompt) would leave an "Error" badge
    # over the prompt box the student types into; the message box says why
    send.click(on_send, [code, name, prompt, mine], [mine, mine_html, timer, prompt, code],
               show_progress="hidden")
    demo.load(_code_from_link, None, [code])
    timer.tick(on_tick, [code, mine], [mine_html, timer], show_progress="hidden")


def _student_poll(registry: RoomRegistry, code: Any, name: Any) -> None:
    """The question of the lesson the teacher plays, with the student's answer box: followed
    on a slow timer (a class of phones polling a published view costs the engine nothing)."""
    sp = student_part()
    answered = gr.State({})  # (lesson, question step) -> the answer this student gave, as written
    shown = gr.State(None)  # what the widgets show now: redrawn only when it changes
    poll_timer = gr.Timer(1.5)

    def current(c):
        try:
            lesson = registry.get(c).lesson if c else None
        except RoomError:
            return None
        return lesson.view if lesson is not None else None

    def asked(pv) -> str | None:
        """The open question's name: its lesson and step (None: no question open)."""
        return None if pv is None or pv.question is None else f"{pv.lesson}:{pv.question['step']}"

    def key_of(pv, said):  # what the widgets show: redrawn when it changes
        return (None if pv is None else (pv.lesson, pv.page, asked(pv), pv.reveal is not None), said)

    def on_poll(c, mine, last, request: gr.Request):
        pv = current(_student_code(c, request))
        said = mine.get(asked(pv), "")
        before = "" if pv is None or pv.reveal is None else mine.get(f"{pv.lesson}:{pv.reveal.step}", "")
        key = key_of(pv, said)
        if key == last:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), last
        # a question the widgets have not shown before starts with an empty box
        fresh = not (last and last[0] and last[0][2] == asked(pv))
        return (*student_poll(pv, said, before, fresh), key)

    @room_errors
    def on_answer(c, n, typed, picked, mine, request: gr.Request):
        c = _student_code(c, request)
        room = registry.get(c)
        pv = current(c)
        choice = pv is not None and pv.question is not None and pv.question["kind"] == "choice"
        said = room.answer(student_key(request), picked if choice else typed, n)
        mine = {**mine, asked(pv): said}
        # the box keeps what the student typed; the next tick redraws what changed since
        return (mine, *student_poll(pv, said), key_of(pv, said))

    outs = [sp.text, sp.answer, sp.pick, sp.send]
    poll_timer.tick(on_poll, [code, answered, shown], [*outs, shown], show_progress="hidden")
    sp.send.click(on_answer, [code, name, sp.answer, sp.pick, answered], [answered, *outs, shown],
                  show_progress="hidden")  # as Send's: a refused answer leaves the box usable
