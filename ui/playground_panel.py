"""The Playground controls: New sequence (prompt), Append n, Fork, Free on the chosen sequence.
A sequence is chosen by clicking its row in the picture or with the dropdown (keyboard path)."""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from engine import ops
from ui import limits
from ui.page import Page, guard, show
from ui.session import Session, UserError


def seq_id(value) -> int:
    if value in (None, ""):
        raise UserError("choose a sequence first (start one with New sequence)")
    return limits.whole(value, "the sequence id", 0, 1 << 62)


def playground_panel(page: Page) -> Callable[[], None]:
    # no max_length (the browser would cut a paste without a word) and no Gradio bounds or
    # precision on the count (Gradio would round 2.5 silently or refuse 0 without naming the
    # field): the handlers' checks refuse with a message that names the field
    prompt = gr.Textbox(label="prompt", value="Four score and seven years ago", lines=1)
    with gr.Row():
        as_chat = gr.Checkbox(label="as a chat message", value=False, min_width=120)
        new_seq = gr.Button("New sequence", variant="primary", elem_id="new-seq", min_width=120)
    with gr.Row():
        page.seq = gr.Dropdown([], label="sequence (or click its row)", allow_custom_value=False,
                               elem_id="seq-choice", min_width=110)
        n = gr.Number(value=1, label="tokens", min_width=70)
    with gr.Row():
        append = gr.Button("Append n", elem_id="append", min_width=70)
        fork = gr.Button("Fork", elem_id="fork", min_width=60)
        free = gr.Button("Free", elem_id="free", min_width=60)

    @guard
    def on_new(text, chat, session: Session):
        if not isinstance(text, str):
            raise UserError("the prompt must be text")
        limits.check_prompt(text)
        if chat and not session.engine.config.dry:
            ids = session.engine.tokenizer.apply_chat_template(text)
            session.selected_seq = session.run(ops.AddSequence(ids))
        else:
            session.selected_seq = session.run(ops.AddSequence(text))
        return show(session)

    @guard
    def on_append(s, count, session: Session):
        count = limits.whole(count, "tokens", 1, limits.MAX_APPEND)
        session.selected_seq = seq_id(s)
        session.run(ops.Append(session.selected_seq, n=count))
        return show(session)

    @guard
    def on_fork(s, session: Session):
        session.selected_seq = session.run(ops.Fork(seq_id(s)))
        return show(session)

    @guard
    def on_free(s, session: Session):
        session.run(ops.Free(seq_id(s)))
        session.selected_seq = None
        return show(session)

    def on_choose(s, session: Session):
        """The dropdown picked a sequence: outline its row (a view change, no operation).
        Gradio sends this at every blur of the box too, its value unchanged: that draws
        nothing, as its answer could land after an operation's and show the pool before it."""
        chosen = None if s in (None, "") else int(s)
        if chosen == session.selected_seq:
            return tuple(gr.skip() for _ in page.outs)
        session.selected_seq = chosen
        return show(session)

    def wire() -> None:
        outs, quiet = page.outs, page.quiet
        new_seq.click(on_new, [prompt, as_chat, page.state], outs, **quiet)
        append.click(on_append, [page.seq, n, page.state], outs, **quiet)
        fork.click(on_fork, [page.seq, page.state], outs, **quiet)
        free.click(on_free, [page.seq, page.state], outs, **quiet)
        page.seq.input(on_choose, [page.seq, page.state], outs, **quiet)
    return wire
