"""How the picture and the view of the run under it share a slide (ui/picture_split.py): the
picture keeps its tokens in their slots wherever the whole slide has room for them, and a
page's choice is kept by the page itself (no state shared between sessions)."""

from __future__ import annotations

import copy

from engine import EngineConfig, LLMEngine
from ui.picture_split import FitMemo, fit_split
from viz.pool_figure import pool_figure

SLIDE = (790, 650)  # the picture column of presenter mode at 1280 x 720


def _fit(fig) -> dict:
    return fig.layout.meta["fit"]


def _engine() -> LLMEngine:
    """A pool like lesson 12's (64 blocks of 4 slots) with 37 blocks in use, two tables: at a
    slide's share under a view it is drawn a cell per block, in the whole slide slot by slot."""
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=64))
    seq = eng.add_sequence("The cat sat on the mat and looked at the dog. " * 3)
    eng.append(eng.fork(seq), token_ids=[70, 71, 72])
    return eng


def test_a_pool_whose_slots_fit_the_slide_keeps_them_beside_the_view():
    eng = _engine()
    snap = eng.snapshot()
    draws: list[tuple[int, int]] = []

    def draw(box):
        draws.append(box)
        return pool_figure(snap, (), eng.decode, large=True, box=box)

    alone = draw(SLIDE)
    assert _fit(alone)["slots"] and _fit(alone)["whole"]  # the slide alone shows the tokens
    assert not _fit(draw((SLIDE[0], int(0.56 * SLIDE[1]))))["slots"]  # its least share does not
    fig, view_box = fit_split(FitMemo(), "k", SLIDE, "timeline", draw)
    assert _fit(fig)["slots"] and _fit(fig)["whole"]  # the view under it never costs them
    if view_box is not None:
        assert view_box[1] > 0 and view_box[1] < SLIDE[1] / 2


def test_the_choice_is_kept_per_page_and_a_copied_page_starts_afresh():
    eng = _engine()
    snap = eng.snapshot()
    calls = []

    def draw(box):
        calls.append(box)
        return pool_figure(snap, (), eng.decode, large=True, box=box)

    memo = FitMemo()
    first = fit_split(memo, "k", SLIDE, "memory", draw)
    n = len(calls)
    again = fit_split(memo, "k", SLIDE, "memory", draw)
    assert len(calls) == n and again[0] is first[0] and again[1] == first[1]  # kept, not redrawn
    fit_split(copy.deepcopy(memo), "k", SLIDE, "memory", draw)
    assert len(calls) > n  # a session's copy (gr.State) does not share the page's choices
    fit_split(FitMemo(), "k", SLIDE, "memory", draw)
