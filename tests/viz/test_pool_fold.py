"""A picture that reads at every pool size: in the default playground pool (64 blocks of 16
slots) the blocks holding data are drawn with slots wide enough for a 6-character token, whole,
and runs of free blocks fold into one labelled row; presenter mode draws tokens and block ids at
~18 px, whole in a lesson's pool; a full pool still shows every block."""

from __future__ import annotations

import plotly.graph_objects as go

from engine import EngineConfig, LLMEngine, ops
from viz import pool_figure
from viz.pool_layout import FOLD_ROWS, gpu_layout

WORDS = ["Four", "scores", "andxyz", "seven!", "years", "agoago"]  # up to 6 characters


def decode(ids: list[int]) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in ids)


def playground(**kw) -> LLMEngine:
    eng = LLMEngine(EngineConfig(model=None, block_size=16, num_gpu_blocks=64, **kw))
    eng.apply(ops.AddSequence(list(range(30))))
    eng.apply(ops.Fork(0))
    return eng


def pool(fig: go.Figure) -> go.Heatmap:
    return next(t for t in fig.data if t.name == "pool")


def test_the_default_playground_shows_whole_tokens_and_folds_the_free_blocks():
    eng = playground()
    fig = pool_figure(eng.snapshot(), eng.last_events, decode)
    words = {w for row in pool(fig).text for w in row if w}
    assert set(WORDS) <= words  # every token whole, none cut with "…"
    assert not any("…" in w for w in words)
    folds = [a.text for a in fig.layout.annotations if "free (" in (a.text or "")]
    assert folds == ["blocks 2–63 free (62 blocks)"]
    assert len(pool(fig).z) <= FOLD_ROWS


def test_presenter_mode_draws_tokens_and_block_ids_at_18_px():
    """A lesson's pool (24 blocks of 4 slots) on a 1280 x 720 projector."""
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=24))
    eng.apply(ops.AddSequence(list(range(10))))
    fig = pool_figure(eng.snapshot(), eng.last_events, decode, large=True)
    assert pool(fig).textfont.size >= 18
    words = {w for row in pool(fig).text for w in row if w}
    assert {"scores", "seven!"} <= words


def test_a_full_pool_draws_every_block_in_narrower_slots():
    layout = gpu_layout(64, 16, keep=range(64))
    assert layout.token_level and layout.folds == () and layout.per_row > 1
    assert {layout.where(b) for b in range(64)} >= {(0, 0)} and None not in {
        layout.where(b) for b in range(64)}


def test_a_click_on_a_drawn_block_still_names_it():
    eng = playground()
    heat = pool(pool_figure(eng.snapshot(), eng.last_events, decode))
    named = {cd[0] for row in heat.customdata for cd in row if cd is not None}
    assert named == {0, 1}  # the two blocks in use; the folded ones are one labelled row


def test_a_request_is_in_the_picture_from_the_moment_it_is_added():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=16))
    eng.apply(ops.AddRequest(list(range(9))))
    fig = pool_figure(eng.snapshot(), eng.last_events, decode)
    said = [a.text for a in fig.layout.annotations if "waiting" in (a.text or "")]
    assert said == ["waiting, no blocks yet: seq 0"]
    eng.apply(ops.Step())  # scheduled: now a table row, no longer waiting
    fig = pool_figure(eng.snapshot(), eng.last_events, decode)
    assert not [a for a in fig.layout.annotations if "waiting" in (a.text or "")]


def test_a_page_that_asks_which_block_draws_every_block_to_click():
    """A lesson question answered by clicking a block (lessons/README.md: kind: block): no free
    run folds away into a label, so the block the learner predicts can be clicked whatever it
    is: a folded run is drawn as its blocks' id cells (issue 42, item 3)."""
    eng = playground()
    fig = pool_figure(eng.snapshot(), eng.last_events, decode, every_block=True)
    assert not [a.text for a in fig.layout.annotations if "free (" in (a.text or "")]
    drawn = {cd[0] for t in fig.data if t.name in ("pool", "free blocks")
             for row in t.customdata for cd in row if cd}
    assert drawn == set(range(64))
    cells = next(t for t in fig.data if t.name == "free blocks")  # each labelled with its id
    assert all(str(cd[0]) == tx for cr, tr in zip(cells.customdata, cells.text, strict=True)
               for cd, tx in zip(cr, tr, strict=True) if cd)
