"""The views of the run under the main picture: a choice (none, the request timeline, memory over
time, the prefix cache as a tree) beside the mode's controls, and the chosen view's figure in the
picture's column (ui/run_views.py draws it). The view follows the picture: any operation, Back,
Next, the timeline slider, a new box, presenter mode. Clicks on it (ui/views.js): a timeline
cell selects its request and goes to its step, a lane's label selects its request (opening a
sample or beam group into its sequences); a tree cell selects its block, as a click on the block
in the picture does. The selected request's blocks light up in the picture (its first live
sequence is the picture's selected one).

    plot_part(page)          # in the picture's column: the view's figure
    wire = choice_part(page) # beside the controls: the choice; returns the wiring function
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import gradio as gr

from ui import limits
from ui.lesson_player import lesson_fit
from ui.page import Page, guard, show
from ui.picture_box import take_box
from ui.render import session_fit
from ui.run_views import VIEWS, lesson_choice, lesson_view, request_seq, session_view
from ui.session import Session

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "views.js"), encoding="utf-8") as f:
    VIEWS_JS = f.read()

STYLE = """<style>
#view-plot { min-height: 0 }
#view-plot .modebar-container { display: none !important }
#view-plot .nsewdrag { cursor: pointer !important }
#view-choice .wrap { gap: 4px 10px }
body.pl-presenter.pl-lesson #view-choice { display: none !important }
body.pl-presenter #picture-col #view-plot { margin-top: 0 }
/* a slide's column scrolls when its controls are taller than the screen: a wrapping flex column
   would put the rest in a second column beside it, out of sight */
body.pl-presenter #controls-col { flex-wrap: nowrap !important }
body.pl-presenter #controls-col > * { flex-shrink: 0 }
</style>"""


def plot_part(page: Page) -> None:
    """The view's figure, under the picture (hidden while the choice is none)."""
    page.view_plot = gr.Plot(show_label=False, elem_id="view-plot", visible=False)


def choice_part(page: Page, presenter: gr.Checkbox) -> Callable[[], None]:
    choice = gr.Radio(list(VIEWS), value="none", label="under the picture", elem_id="view-choice",
                      info="the run over time, or the prefix cache as a tree")
    click_box = gr.Textbox(elem_id="pl-view-click", elem_classes=["pl-hidden"], show_label=False,
                           container=False)
    click_go = gr.Button("view click", elem_id="pl-view-go", elem_classes=["pl-hidden"])
    gr.HTML(STYLE, js_on_load=VIEWS_JS, elem_id="views-script", padding=False)
    page.view_choice = choice

    def draw(session: Session, ls: Any) -> Any:
        """The view's figure for what is in front (in what the picture leaves of the box), and
        whether to show it."""
        if session.lesson_front:
            box = lesson_fit(ls, session.presenter)[1] if getattr(ls, "run", None) else None
            fig = lesson_view(ls, session.presenter, box)
        else:
            fig = session_view(session, session_fit(session)[1])
        chosen = lesson_choice(ls) if session.lesson_front else session.view_choice
        return gr.update(value=fig, visible=fig is not None), gr.update(value=chosen)

    def on_view_follow(session: Session, ls):
        """The status line changed (an operation, Back / Next, a lesson page): redraw the view,
        unless what it shows is what it showed (the picture's box may be reported again)."""
        run = getattr(ls, "run", None)
        shown = (session.lesson_front, id(run), run and run.index, id(run and run.current),
                 session.pos, len(session.ops), session.box, getattr(ls, "box", None),
                 session.presenter, session.view_choice, getattr(ls, "view_choice", None),
                 session.selected_request, session.open_request, session.selected_block,
                 getattr(ls, "inspected", None))
        if shown == session.view_drawn:
            return gr.skip(), gr.skip()
        session.view_drawn = shown
        return draw(session, ls)

    def on_view_presenter(on, session: Session, ls):
        session.presenter = bool(on)  # the page's own handler may not have run yet
        return draw(session, ls)

    def on_view_box(value, session: Session, ls):
        """The page measured a new box: the picture's handler keeps it too (ui/picture_box.py),
        and this one may run first, so it keeps it itself and draws for it."""
        take_box(value, session, ls)
        return draw(session, ls)

    @guard
    def on_view_choice(value, session: Session, ls):
        if value not in VIEWS:
            raise limits.UserError(f"choose one of {', '.join(VIEWS)}")
        if session.lesson_front and ls is not None:
            lesson_choice(ls)  # the lesson's own first, so the learner's choice is not undone
            ls.view_choice = value
            return (*(gr.update() for _ in page.outs), *draw(session, ls))
        session.view_choice = value
        return (*show(session), *draw(session, ls))  # the pool's share of the box changes

    @guard
    def on_view_click(value, session: Session, ls):
        what, _, rest = str(value or "").partition(":")
        parts = rest.partition("|")[0].split(":")
        if session.lesson_front or not all(p.isdigit() for p in parts) or not parts[0]:
            return (*(gr.update() for _ in page.outs), *draw(session, ls))
        rid = int(parts[0])
        if what == "cell" and len(parts) == 2:
            session.goto(limits.whole(int(parts[1]), "the step", 0, len(session.ops)))
        elif what == "lane":  # a group's label opens it into its sequences, or closes it
            session.open_request = None if session.open_request == rid else rid
        session.selected_request = rid
        seq = request_seq(session.frame().requests, rid)
        if seq is not None:
            session.selected_seq = seq
        return (*show(session), *draw(session, ls))

    def wire() -> None:
        state, lesson = page.state, page.lesson
        outs = [page.view_plot, choice]
        # the status line changes with every operation and move over the log (ui/app.py)
        page.follow.click(on_view_follow, [state, lesson], outs, show_progress="hidden")
        presenter.change(on_view_presenter, [presenter, state, lesson], outs, show_progress="hidden")
        page.box_go.click(on_view_box, [page.box_input, state, lesson], outs, show_progress="hidden")
        choice.input(on_view_choice, [choice, state, lesson], [*page.outs, *outs], **page.quiet)
        click_go.click(on_view_click, [click_box, state, lesson], [*page.outs, *outs], **page.quiet)
    return wire
