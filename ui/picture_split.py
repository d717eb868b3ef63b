"""How the picture (the pool) and the view of the run under it share the picture's box.

Without a height (a laptop's page, a phone) each is as tall as it needs, one under the other. On
a slide (presenter mode: a box with a height) the picture comes first: it keeps the least of
SHARES of the height at which it is drawn as well as in the whole box (every token and id in its
cell, viz/fit.py; tokens in their slots where the whole box has room for them),
and the view gets the rest; where even the largest share is not enough but the whole box is,
the view is left off this slide (the picture as it would be without it); a picture that is not
whole even in the whole box (a big pool drawn a cell per block) keeps the smallest share. The
choice is made once per state and box and kept in the page's own FitMemo (its session or lesson
holds one), so the picture's handler and the view's agree whichever runs first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

SHARES = (0.56, 0.66)  # a view given less than a third of a slide is left off (no room for its lanes)
MOST = 0.8  # the picture's largest share, where the view needs little (one lane, a short tree)
GAP = 22  # the plots' own padding between the picture and the view
KEEP = 12  # pictures kept (the last few positions a page showed)

Box = tuple[int, int]


class FitMemo:
    """The pictures drawn for one page (a session or a lesson run), by state, box and view:
    on a slide (share, picture), elsewhere the picture. A state drawn again (Back and Next over
    the same few positions, the view's follower asking for the picture's box) is not drawn
    again."""

    def __init__(self) -> None:
        self._fits: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()  # the picture's and the view's handlers may run at once

    def get(self, key: Hashable) -> Any:
        with self._lock:
            hit = self._fits.get(key)
            if hit is not None:
                self._fits.move_to_end(key)
            return hit

    def put(self, key: Hashable, hit: Any) -> None:
        with self._lock:
            self._fits[key] = hit
            while len(self._fits) > KEEP:
                self._fits.popitem(last=False)

    def __deepcopy__(self, memo: dict) -> FitMemo:
        return FitMemo()  # a copied session starts with no choices (and a lock of its own)


def split_box(box: Box | None, choice: str, share: float = SHARES[0]
              ) -> tuple[Box | None, Box | None]:
    """(the picture's box, the view's box) for the picture's box, with `choice` under it."""
    if box is None or choice == "none":
        return box, box
    w, h = box
    if not h:
        return box, (w, 0)
    pool = int(h * share)
    return (w, pool), (w, h - pool - GAP)


def drawn_for(fig: Any, box: Box | None) -> Any:
    """The picture drawn for its share of `box` says it was drawn for `box`: the page asks
    again for a picture whose box differs from the one it measured (ui/motion.js)."""
    fit = dict((fig.layout.meta or {}).get("fit") or {})
    if fit and box is not None:
        fig.layout.meta = {**fig.layout.meta, "fit": {**fit, "box": list(box)}}
    return fig


def _fit(fig: Any) -> dict:
    return (fig.layout.meta or {}).get("fit") or {}


def _whole(fig: Any, slots: bool = False) -> bool:
    """Whether every text of the picture is whole (and, with `slots`, its tokens drawn in their
    slots, not a cell per block)."""
    fit = _fit(fig)
    return bool(fit.get("whole")) and (fit.get("slots", True) or not slots)


def fit_split(memo: FitMemo, key: Hashable, box: Box | None, choice: str,
              draw: Callable[[Box | None], Any],
              need: Callable[[int], int | None] | None = None) -> tuple[Any, Box | None]:
    """(the picture, the view's box or None: no view on this slide); `draw(box)` draws the
    picture in a box, `key` names everything else it depends on, `memo` keeps the choice.
    `need(width)`: the height the view takes at its natural size (None: unknown); the view
    then gets that much and the picture the rest, as large as it comes."""
    memo_key = (key, None if box is None else tuple(box), choice)
    if box is None or choice == "none" or not box[1]:
        pool, view = split_box(box, choice)
        fig = memo.get(memo_key)  # the same state drawn again (Back / Next, the view's follower)
        if fig is None:
            fig = drawn_for(draw(pool), box)
            memo.put(memo_key, fig)
        return _with_view(fig, view if choice != "none" else None)
    hit = memo.get(memo_key)
    if hit is None:
        hit = _choose(box, draw, need)
        memo.put(memo_key, hit)
    share, fig = hit
    return _with_view(fig, None if share is None else split_box(box, choice, share)[1])


def _with_view(fig: Any, view: Box | None) -> tuple[Any, Box | None]:
    """The picture says whether a view of the run shares its box and how tall the view may be
    (the page's tests wait for the view to match), and the view's box."""
    fit = _fit(fig)
    if fit:
        fig.layout.meta = {**fig.layout.meta, "fit": {**fit, "view": view is not None,
                                                      "view_h": view[1] if view else None}}
    return fig, view


def _choose(box: Box, draw: Callable[[Box | None], Any],
            need: Callable[[int], int | None] | None = None) -> tuple[float | None, Any]:
    """The share that leaves the view what it needs, if the picture is whole there; else the
    smallest share at which the picture is drawn as well as in the whole box: whole, and its
    tokens in their slots where the whole box has room for them (a lesson about slots must not
    lose them to the view under it). A fixed share gave a one-lane timeline half the slide and
    left the pool at a third of it, its tokens at 14 px over an empty band."""
    w, h = box
    full = draw(box)
    slots = _whole(full, slots=True)
    want = need(w) if need is not None else None
    if want:
        share = min(MOST, max(SHARES[0], 1 - (want + GAP) / h))
        fig = draw((w, int(h * share)))
        if _whole(fig, slots):
            return share, drawn_for(fig, box)
    first = None
    for share in SHARES:
        fig = draw((w, int(h * share)))
        first = first or fig
        if _whole(fig, slots):
            return share, drawn_for(fig, box)
    if _whole(full):
        return None, drawn_for(full, box)
    return SHARES[0], drawn_for(first, box)
