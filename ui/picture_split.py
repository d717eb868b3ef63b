"""How the picture (the pool) and the view of the run under it share the picture's box.

Without a height (a laptop's page, a phone) each is as tall as it needs, one under the other. On
a slide (presenter mode: a box with a height) the picture comes first: it keeps the least of
SHARES of the height at which it is drawn whole (every token and id in its cell, viz/fit.py),
and the view gets the rest; where even the largest share is not enough but the whole box is,
the view is left off this slide (the picture as it would be without it); a picture that is not
whole even in the whole box (a big pool drawn a cell per block) keeps the smallest share. The
choice is made once per state and box and kept (FITS), so the picture's handler and the view's
agree whichever runs first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

SHARES = (0.56, 0.66, 0.76)
GAP = 22  # the plots' own padding between the picture and the view
KEEP = 64  # choices kept (a few per session and page)
_FITS: OrderedDict[Hashable, tuple[float | None, Any]] = OrderedDict()
_LOCK = threading.Lock()

Box = tuple[int, int]


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


def _whole(fig: Any) -> bool:
    return bool(((fig.layout.meta or {}).get("fit") or {}).get("whole"))


def fit_split(key: Hashable, box: Box | None, choice: str, draw: Callable[[Box | None], Any]
              ) -> tuple[Any, Box | None]:
    """(the picture, the view's box or None: no view on this slide); `draw(box)` draws the
    picture in a box, `key` names everything else it depends on."""
    if box is None or choice == "none" or not box[1]:
        pool, view = split_box(box, choice)
        return drawn_for(draw(pool), box), (view if choice != "none" else None)
    key = (key, tuple(box), choice)
    with _LOCK:
        hit = _FITS.get(key)
    if hit is None:
        hit = _choose(box, draw)
        with _LOCK:
            _FITS[key] = hit
            while len(_FITS) > KEEP:
                _FITS.popitem(last=False)
    share, fig = hit
    return fig, (None if share is None else split_box(box, choice, share)[1])


def _choose(box: Box, draw: Callable[[Box | None], Any]) -> tuple[float | None, Any]:
    w, h = box
    first = None
    for share in SHARES:
        fig = draw((w, int(h * share)))
        first = first or fig
        if _whole(fig):
            return share, drawn_for(fig, box)
    full = draw(box)
    if _whole(full):
        return None, drawn_for(full, box)
    return SHARES[0], drawn_for(first, box)
