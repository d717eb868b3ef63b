"""The vLLM tab ("Watch a vLLM"): a real vLLM's prefix cache, drawn from the KV events it
publishes, in the picture's place while the tab is in front.

Controls (in the tab): the KV events endpoint to connect to (its replay endpoint and OpenAI
address under "more"), or Start one here (the lab's local CPU vLLM, engine/vllm/lab.py: one per
app process, shared by every page); a prompt box whose prompts go to that server's OpenAI API.
The picture (in the picture's column): PagedLab's own prefix tree figure of vLLM's cache, and
under it the blocks vLLM stored and removed over time; beside it the counts, the last events
and the prompts sent, with what events cannot show.

A gr.Timer polls this page's watch (ui/vllm_view.py) every TICK_S and sends only what changed:
nothing at all when nothing came. No handler waits for vLLM: prompts are answered in threads of
their own, and a tick waits at most TICK_WAIT_S for vLLM's next message. What the watch cannot
read (an endpoint that does not answer, a server without events, another schema, a gap) is said
in the tab's note, and the picture keeps what it had.

`python app.py --vllm-events tcp://HOST:PORT` opens every page on this tab, watching that server.
"""

from __future__ import annotations

import html
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from engine.describe.prefix_tree import PrefixTree
from engine.vllm.watch import CANNOT_SHOW
from ui.page import Page, guard
from ui.session import Session
from ui.vllm_view import VllmView
from viz.vllm_watch import vllm_counts_html, vllm_events_markdown, vllm_timeline_figure, vllm_tree_figure

#: seconds between the timer's looks at the watch (a redraw within ~0.3 s of vLLM's step)
TICK_S = 0.1
#: how long a tick waits at the watch for vLLM's next message before it comes back empty
TICK_WAIT_S = 0.2
#: the timeline is drawn again at most this often (the tree at every message)
TIMELINE_S = 1.0
#: the tab's line is sent again at least this often, changed or not. Answers reach the page in
#: the order they are sent, not computed: a select's (its figures take long to send) computed
#: while the line said "connecting to ..." can land after the tick that carried "Watching", and
#: later ticks, which send changes only, would leave the old line for good (a loaded full run)
NOTE_RESEND_S = 2.0
_EMPTY = PrefixTree(())  # nothing watched yet
#: a tick's last input, filled in the page as the tick leaves it: whether the vLLM tab is the one
#: selected. The tab events that tell the server are answered in any order, and a late one (the
#: select of the tab a page mounted on, sent unqueued) can outrank the one that brought the tab
#: in front: a loaded 2-core run saw a page's watch rest on "connecting to ..." for good.
#: (ui/motion.js's window.plFrontTab; null where that script is missing: the server's flag decides)
TICK_JS = ("(...inputs) => [...inputs.slice(0, -1), "
           "window.plFrontTab ? window.plFrontTab() === 'vLLM' : null]")
INTRO = ("**Watch a real vLLM.** Its prefix cache, drawn from the KV events it publishes: "
         "PagedLab's own tree of its cached blocks (the same hashes PagedLab computes), the "
         "blocks it stored and removed over time, its counts.\n\n"
         f"**What events cannot show.** {CANNOT_SHOW}")


@dataclass(frozen=True)
class VllmTarget:
    """The server `--vllm-events` names: every page opens watching it."""

    events: str
    replay: str | None = None
    url: str | None = None


@dataclass
class VllmParts:
    """The tab's widgets that ui/app.py places or wires beyond the tab."""

    view: Any  # gr.State(VllmView)
    tree: Any
    timeline: Any
    panels: list  # the tab's own outputs: counts, events, prompts, note
    timer: Any
    select: Callable  # (view, session) -> the values of `outputs` (the tab came to the front)
    outputs: list  # what `select` gives values for


def picture_part() -> tuple[Any, Any]:
    """The tree and the timeline, in the picture's column (the page shows it only while the tab
    is in front: ui/theme.py)."""
    with gr.Column(elem_id="vllm-picture"):
        tree = gr.Plot(show_label=False, elem_id="vllm-tree")
        timeline = gr.Plot(show_label=False, elem_id="vllm-timeline")
    return tree, timeline


def vllm_panel(page: Page, picture: tuple[Any, Any], target: VllmTarget | None = None
               ) -> VllmParts:
    """The tab's controls (inside its gr.Tab), wired; `picture`: picture_part()'s widgets."""
    tree, timeline = picture
    # a browser session's watch; closed when the session ends (and on unload: ui/app.py)
    view = gr.State(VllmView(), time_to_live=24 * 3600, delete_callback=VllmView.close)
    gr.Markdown(INTRO, elem_id="vllm-intro")
    events = gr.Textbox(label="vLLM's KV events endpoint", placeholder="tcp://HOST:5557",
                        elem_id="vllm-events", value=target.events if target else "")
    with gr.Accordion("more: its replay endpoint, its OpenAI API", open=False):
        replay = gr.Textbox(label="replay endpoint (fills gaps)", placeholder="tcp://HOST:5558",
                            elem_id="vllm-replay", value=(target.replay or "") if target else "")
        url = gr.Textbox(label="OpenAI API (where prompts go)", placeholder="http://HOST:8000",
                         elem_id="vllm-url", value=(target.url or "") if target else "")
    with gr.Row():
        connect = gr.Button("Connect", elem_id="vllm-connect", min_width=80)
        start = gr.Button("Start one here", elem_id="vllm-start", min_width=110)
    note = gr.Markdown(elem_id="vllm-note")
    prompt = gr.Textbox(label="a prompt for vLLM", lines=2, elem_id="vllm-prompt",
                        value="What does a page table do?")
    send = gr.Button("Send to vLLM", variant="primary", elem_id="vllm-send")
    counts = gr.HTML(elem_id="vllm-counts")
    log = gr.Markdown(elem_id="vllm-log")
    sent = gr.HTML(elem_id="vllm-sent-box")
    timer = gr.Timer(TICK_S, active=False)
    panels = [counts, log, sent, note]
    outs = [tree, timeline, *panels]
    state = [view, page.state]

    def all_values(v: VllmView, session: Session, force: bool) -> tuple:
        with v._lock:
            return _values(v, session, force)

    @guard
    def on_vllm_connect(ev, rp, u, v: VllmView, session: Session):
        v.connect(ev or "", rp, u)
        v.poll()
        return (*all_values(v, session, True), gr.Timer(active=True))

    @guard
    def on_vllm_start(v: VllmView, session: Session):
        v.start_here()
        v.poll()
        return (*all_values(v, session, True), gr.Timer(active=True))

    @guard
    def on_vllm_send(text, v: VllmView, session: Session):
        v.send(text)
        return (*all_values(v, session, False), gr.Timer(active=True))

    def on_vllm_tick(v: VllmView, session: Session, shown: bool | None = None):
        """Redraw what changed since the last look, and only that (nothing: every output
        skipped). The tick waits up to TICK_WAIT_S for vLLM's next message (the page sends the
        next tick once this one is back), so a message is drawn as soon as it comes. `shown`:
        whether the page shows the tab as this tick leaves it (TICK_JS), which outranks the
        server's idea from tab events (None: no page said, as from an API call)."""
        if not (v.in_front if shown is None else shown):  # another tab is in front: it rests
            return (*(gr.skip() for _ in outs), gr.Timer(active=False))
        try:
            v.poll(TICK_WAIT_S)
            return (*all_values(v, session, False), gr.skip())
        except Exception:  # a bug must reach the log, never stop the page's timer
            traceback.print_exc(file=sys.stderr)
            return tuple(gr.skip() for _ in range(len(outs) + 1))

    def on_vllm_select(v: VllmView, session: Session) -> tuple:
        """The tab came to the front (the caller brought it: `VllmView.bring`): the picture's
        place shows this page's watch."""
        if target is not None and v.watch is None and v.pending is None and not v.note:
            try:  # --vllm-events: the first look connects
                v.connect(target.events, target.replay, target.url)
            except Exception as err:  # a bad flag: said in the tab, the page works as usual
                v.note = f"could not watch {target.events}: {err}"
        return (*all_values(v, session, True), gr.Timer(active=True))

    connect.click(on_vllm_connect, [events, replay, url, *state], [*outs, timer], **page.quiet)
    start.click(on_vllm_start, state, [*outs, timer], **page.quiet)
    send.click(on_vllm_send, [prompt, *state], [*outs, timer], **page.quiet)
    prompt.submit(on_vllm_send, [prompt, *state], [*outs, timer], **page.quiet)
    # ticks queue apart from the page's clicks (no limit: a tick that finds nothing is cheap)
    shown = gr.Checkbox(visible=False)  # filled in the page by TICK_JS
    timer.tick(on_vllm_tick, [*state, shown], [*outs, timer], js=TICK_JS, show_progress="hidden",
               concurrency_limit=None, concurrency_id="vllm-tick")
    return VllmParts(view, tree, timeline, panels, timer, on_vllm_select, [*outs, timer])


def _values(v: VllmView, session: Session, force: bool) -> tuple:
    """(tree, timeline, counts, events, prompts, note): each a new value where it changed since
    the page got it (or `force`), else gr.skip()."""
    box, large = session.box, session.presenter
    tree_box, line_box = _split(box)
    watch = v.watch
    fresh = force or v.version != v.drawn
    tree = timeline = gr.skip()
    if fresh:
        got = watch.tree() if watch is not None else None
        if got is not None and (got.nodes or v.removed or watch.mirror.batches):
            fig = vllm_tree_figure(got, v.new, v.removed, v.before, v.decode, box=tree_box,
                                   large=large)
            fig.layout.meta = {**(fig.layout.meta or {}), "vllm": {
                "seq": watch.last_seq, "blocks": len(got.nodes), "taken_at": v.taken_at,
                "drawn_at": time.time(), "watch_opened_at": watch.opened_at}}
            tree = fig
            v.drew(v.version, got)
            v.shown["tree"] = True
        elif force or "tree" not in v.shown:  # nothing watched yet: say how to begin
            tree = vllm_tree_figure(got or _EMPTY, box=tree_box, large=large)
            v.shown["tree"] = True
            if got is not None:
                v.drew(v.version, got)
    # the timeline follows at most every TIMELINE_S, also after the last message came: a
    # message within TIMELINE_S of the timeline's last drawing is drawn at a later tick
    batches = watch.mirror.batches if watch is not None else -1
    seen, at = v.timeline_drawn
    if force or (batches != seen and time.monotonic() - at >= TIMELINE_S):
        timeline = vllm_timeline_figure(watch.timeline() if watch else [], box=line_box,
                                        large=large)
        v.timeline_drawn = (batches, time.monotonic())
    panels = (vllm_counts_html(watch.counts(), watch.status()) if watch is not None else "",
              vllm_events_markdown(list(v.recent), v.decode) if watch is not None else "",
              sent_html(v), note_text(v))
    out = [tree, timeline]
    now = time.monotonic()
    resend = {"note"} if now - v.note_sent_at >= NOTE_RESEND_S else set()
    sent = set()
    for key, value in zip(("counts", "log", "sent", "note"), panels, strict=True):
        if force or key in resend or v.shown.get(key) != value:
            sent.add(key)
        out.append(value if key in sent else gr.skip())
        v.shown[key] = value
    if "note" in sent:  # its clock starts again
        v.note_sent_at = now
    return tuple(out)


def _split(box: tuple[int, int] | None) -> tuple[Any, Any]:
    """The tree's and the timeline's share of the picture's box (a slide: 70 / 30)."""
    if box is None or not box[1]:
        return box, box
    w, h = box
    return (w, int(h * 0.7)), (w, int(h * 0.3) - 20)


def note_text(v: VllmView) -> str:
    """The tab's line: what was done, and the newest problem the watch named (the picture keeps
    what it had)."""
    parts = [html.escape(v.note)] if v.note else []
    watch = v.watch
    problem = watch.problem if watch is not None else None  # a gap or a bad frame stays said
    if problem is not None and problem.kind == "silent" and watch.joined and not v.note:
        # joined, and vLLM sent nothing yet: an idle vLLM (its cache has not changed) or one
        # without KV events; it is watched either way, and the first prompt tells them apart
        why = problem.message.partition(" s: ")[2] or problem.message  # the endpoint is said
        parts.append(f"Watching `{watch.endpoint}`: no KV events came yet. {html.escape(why)}")
    elif problem is not None and problem.message not in v.note:
        parts.append(f"**Problem:** {html.escape(problem.message)} _(the picture "
                     f"keeps what it had)_")
    elif watch is not None and not v.note:
        parts.append(f"Watching `{watch.endpoint}`" + ("" if v.client else
                     " (events only: give its OpenAI API under more to send prompts)"))
    return "\n\n".join(parts) or ("Type a vLLM's KV events endpoint and press Connect, or press "
                                  "Start one here (a vLLM on this machine's CPU).")


def sent_html(v: VllmView) -> str:
    """The prompts this page sent to vLLM, newest first, with its answer and how many of the
    prompt's tokens it found cached (vLLM's num_cached_tokens)."""
    if not v.sent:
        return ""
    rows = []
    for s in list(v.sent):
        if s.status == "done":
            what = f"{s.cached_tokens} of its {s.prompt_tokens} prompt tokens were cached in vLLM"
            body = html.escape(s.text) or "<i>(no text)</i>"
        elif s.status == "failed":
            what, body = "not answered", f"<span style='color:#b00'>{html.escape(s.text)}</span>"
        else:
            what, body = "on its way…", "<i>…</i>"
        rows.append(f"<div class='vllm-sent' data-status='{s.status}' style='border-bottom:1px "
                    f"solid #ddd;padding:4px 0'><b>{html.escape(s.prompt)}</b> "
                    f"<span style='color:#555'>· {what}</span><div>{body}</div></div>")
    return f"<div id='vllm-sent'><p><b>Prompts sent to vLLM</b></p>{''.join(rows)}</div>"

