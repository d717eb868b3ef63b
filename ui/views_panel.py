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

import gradio as gr

from ui import limits
from ui.front import front
from ui.page import SCRIPTED, Follower, Page, guard, show
from ui.picture_box import take_box
from ui.run_views import VIEWS
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


def drawn_key(session: Session) -> tuple:
    """What the view under the picture shows: the run in front where it is, and how."""
    shown = front(session)
    return (*shown.view_key(), session.box, session.presenter, shown.view_choice)


def draw(session: Session) -> tuple:
    """The view's figure for the run in front (in what the picture leaves of the box), whether to
    show it, and the choice: the values of [page.view_plot, the choice]."""
    shown, key = front(session), drawn_key(session)
    fig = shown.view_figure()
    # Next or an operation may have moved the run while the figure was drawn (its event runs
    # beside this one): then this figure is not that key's, and the next follow draws again
    session.view_drawn = key if drawn_key(session) == key else None
    return gr.update(value=fig, visible=fig is not None), gr.update(value=shown.view_choice)


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
    page.view_outs = [page.view_plot, choice]

    def on_view_follow(session: Session):
        """The status line changed (an operation, Back / Next, a lesson page): redraw the view,
        unless what it shows is what it showed (the picture's box may be reported again, and
        Back / Next send the view with the picture)."""
        if drawn_key(session) == session.view_drawn:
            return gr.skip(), gr.skip()
        return draw(session)

    def on_view_presenter(on, session: Session):
        session.presenter = bool(on)  # the page's own handler may not have run yet
        return draw(session)

    def on_view_box(value, session: Session):
        """The page measured a new box: the picture's handler keeps it too (ui/picture_box.py),
        and this one may run first, so it keeps it itself and draws for it."""
        take_box(value, session)
        return draw(session)

    @guard
    def on_view_choice(value, session: Session):
        if value not in VIEWS:
            raise limits.UserError(f"choose one of {', '.join(VIEWS)}")
        front(session).view_choice = value
        return (*show(session), *draw(session))  # the pool's share of the box changes

    @guard
    def on_view_click(value, session: Session):
        what, _, rest = str(value or "").partition(":")
        parts = rest.partition("|")[0].split(":")
        if not front(session).click_view(what, parts):
            return (*(gr.update() for _ in page.outs), *draw(session))
        return (*show(session), *draw(session))

    def wire() -> None:
        state = page.state
        outs = [page.view_plot, choice]
        # the status line changes with every operation and move over the log (ui/app.py)
        page.followers.append(Follower(on_view_follow, [state], outs))
        presenter.change(on_view_presenter, [presenter, state], outs, show_progress="hidden")
        page.box_go.click(on_view_box, [page.box_input, state], outs, show_progress="hidden",
                          **SCRIPTED)
        choice.input(on_view_choice, [choice, state], [*page.outs, *outs], **page.quiet)
        click_go.click(on_view_click, [click_box, state], [*page.outs, *outs], **page.quiet,
                       **SCRIPTED)
    return wire
