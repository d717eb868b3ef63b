"""The prefix cache as a tree (engine/describe/prefix_tree.py): every hashed full block is a cell
right of the block its hash chains from, the first blocks of prompts at the left, so a class's
shared system prompt is a trunk and each student's prompt a branch off it. A cell shows the
block's tokens and, where there is room, its block id, ref count and place in the LRU order, or
its CPU tier slot; its colour says where it lives (used by one sequence, shared, cached on the
GPU, only in the CPU tier). The step's prefix hits, new hashes, loads and offloads are outlined,
and a block evicted in the step is drawn as a dashed ghost where it was (from the tree before).

    prefix_tree_figure(tree, events=(), decode=None, *, before=None, selected_block=None,
                       box=None, large=False) -> go.Figure

A tree wider than the box folds each chain of blocks without branches into its first block,
one "… k blocks" cell and its last; siblings past what the height holds fold into "+k more".
Click contract (ui/views.js): a cell of the heatmap "prefix tree" carries [GPU block id or -1,
CPU tier slot or -1, ...] in its customdata (a click selects that block in the picture).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from engine.core.events import Event
from engine.describe.prefix_tree import PrefixTree, TreeNode
from viz import palette
from viz.pool_cells import FAST
from viz.text_width import text_px
from viz.tree_layout import CACHED, EVENTS, FOLD, GHOST, SHARED, TIER, USED, Placed, kind_of, place
from viz.view_frame import ViewSizes, base_layout, discrete_scale, key_html, view_sizes

#: what a cell's colour says: (words, fill); plotly's text reads at 4.5:1 on each
KINDS = (("used by one sequence", palette.OWNERS[0]), ("shared", palette.SHARED),
         ("cached on the GPU", palette.CACHED), ("only in the CPU tier", palette.OFFLOAD),
         ("folded", palette.BORDER), ("evicted this step", "#ffffff"),
         ("in vLLM's cache", palette.CACHED))
assert (USED, SHARED, CACHED, TIER, FOLD, GHOST, EVENTS) == tuple(range(len(KINDS)))
# a block one sequence holds takes that sequence's colour, as in the pool (USED is the first
# owner's): the other owners' colours come after the kinds
SCALE = discrete_scale([c for _, c in KINDS] + list(palette.OWNERS[1:]))


def sole_owners(snap: object) -> dict[int, int]:
    """block id -> the sequence holding it, for the blocks one sequence holds (from a snapshot):
    the tree colours them as the pool does."""
    return {b.block_id: b.owners[0] for b in getattr(snap, "blocks", ()) if b.ref_count == 1 and b.owners}


def _colour_of(p: Placed, owners: Mapping[int, int] | None) -> int:
    """The cell's colour: its kind's, or for a block one sequence holds, that sequence's."""
    if p.kind != USED or p.node is None:
        return p.kind
    k = (owners or {}).get(p.node.block_id, 0) % len(palette.OWNERS)
    return USED if k == 0 else len(KINDS) + k - 1


#: the step's marks: words -> outline colour
MARKS = {"prefix hit": palette.PREFIX_HIT, "new hash": palette.NEW,
         "loaded from the tier": palette.LOAD, "offloaded to the tier": palette.OFFLOAD,
         "evicted": palette.EVICT, "selected": palette.SELECT}


def prefix_tree_figure(tree: PrefixTree, events: Sequence[Event] = (),
                       decode: Callable[[list[int]], str] | None = None, *,
                       before: PrefixTree | None = None, selected_block: int | None = None,
                       box: tuple[float, float] | None = None, large: bool = False,
                       title: str = "The prefix cache as a tree",
                       hash_marks: Mapping[str, Collection[int]] | None = None,
                       owners: Mapping[int, int] | None = None) -> go.Figure:
    """`hash_marks`: outlines by block hash (a watched vLLM's events name hashes, not blocks),
    words of MARKS -> hashes; "evicted" hashes found in `before` are drawn as ghosts. `owners`:
    block id -> the sequence holding it alone (sole_owners), for the pool's colours."""
    sz = view_sizes(box, large)
    decode = decode or (lambda ids: " ".join(map(str, ids)))
    hash_marks = {k: set(v) for k, v in (hash_marks or {}).items() if v}
    ghosts = _ghosts(tree, events, before, hash_marks.get("evicted", set()))
    width = (sz.width or 800) - 16
    # the key over the tree: the colours of the nodes there are and the marks of the step
    kinds = {kind_of(n) for n in tree.nodes} | ({GHOST} if ghosts else set())
    marked = _marked_words(events, ghosts, selected_block) + list(hash_marks)
    _, key_lines = key_html(_key(kinds, marked), sz, width)
    top = sz.title * 2.2 + key_lines * sz.font * 1.45 + 4
    two_lines, row_px, placed = _placed(tree, ghosts, sz, width, top)
    cols = max([p.x for p in placed.cells] + [0]) + 1
    rows = max([p.y for p in placed.cells] + [0]) + 1
    cell_px = width / cols
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    custom = [[[-1, -1, ""]] * cols for _ in range(rows)]
    starts = _distinct_starts(placed.cells, decode, lambda t: _fit(t, cell_px - 16, sz.font))
    for p in placed.cells:
        z[p.y][p.x] = _colour_of(p, owners)
        text[p.y][p.x] = _label(p, decode, cell_px, sz, two_lines, starts)
        custom[p.y][p.x] = _custom(p, decode, tree)
    # a phone: a tap selects the block (the picture shows it); a tooltip there covered the tree
    hover = {"hoverinfo": "none"} if sz.phone else {"hovertemplate": "%{customdata[2]}<extra></extra>"}
    heat = go.Heatmap(**FAST, z=z, x=list(range(cols)), y=list(range(rows)), zmin=-0.5,
                      zmax=len(KINDS) + len(palette.OWNERS) - 1.5, colorscale=SCALE, showscale=False,
                      xgap=14, ygap=6,
                      text=text, texttemplate="%{text}", textfont={"size": sz.font},
                      customdata=custom, name="prefix tree", hoverongaps=False, **hover)
    outlines = _outlines(placed, events, selected_block, hash_marks)
    fig = go.Figure([heat, _edges(placed, 0.5 - 9 / max(cell_px, 20)), *outlines], **FAST)
    height = sz.height or int(top + rows * row_px + 12)
    nodes = len(tree.nodes)
    head = f"{title} · {nodes} block{'s' if nodes != 1 else ''}"
    if tree.group != "full":
        head += f" ({tree.group} layers)"
    layout = base_layout(sz, head, height, 8, {"view": "tree", "rows": rows, "cols": cols,
                                               "held": sum(n.ref_count > 0 for n in tree.nodes)})
    layout["margin"].update(t=top, b=max(8, height - top - rows * row_px))
    key, _ = key_html(_key({p.kind for p in placed.cells} - {FOLD},
                           [t.name for t in outlines]), sz, width)
    fig.update_layout(**layout, showlegend=False, annotations=[{
        "xref": "paper", "yref": "paper", "x": 0, "y": 1, "yshift": 4, "xanchor": "left",
        "yanchor": "bottom", "align": "left", "showarrow": False, "text": key,
        "font": {"size": sz.font}}])
    fig.update_xaxes(range=[-0.55, cols - 0.45], visible=False, fixedrange=True)
    fig.update_yaxes(range=[rows - 0.5, -0.5], visible=False, fixedrange=True)
    return fig


def _placed(tree: PrefixTree, ghosts: list, sz: ViewSizes, width: float, top: float
            ) -> tuple[bool, float, Any]:
    """(two lines a cell?, a row's pixels, the cells placed): cells of two lines (tokens, then
    block id, ref count, LRU place) where the height holds every node so, else of one line where
    that shows more of them (a slide's short view hid siblings behind "+2 more" that one-line
    rows had room for); one line on a phone."""
    cols = max(2, int(width // (sz.font * 6.5)))
    best = None
    for two in ((True, False) if not sz.phone else (False,)):
        row_px = sz.font * 1.3 * (2 if two else 1) + 8
        avail = (sz.height - top - 10) if sz.height else 14 * row_px
        placed = place(tree, ghosts, max(2, int(avail // row_px)), cols)
        hidden = sum(int(p.words.split()[0][1:]) for p in placed.cells
                     if p.node is None and p.words.startswith("+"))
        if best is None or hidden < best[0]:
            best = (hidden, two, row_px, placed)
        if not hidden:
            break
    return best[1], best[2], best[3]


def _key(kinds: set[int], marks: Sequence[str]) -> list[tuple]:
    """(colour, words) of the key: each kind of cell drawn, then each mark (as an outline)."""
    owned = "".join(f"<span style='color:{c}'>■</span>" for c in palette.OWNERS[1:4])
    out = [(colour, f"{owned} {words}" if k == USED else words) for k, (words, colour)
           in enumerate(KINDS) if k in kinds and k != GHOST]
    return out + [(MARKS[m], m, "▭") for m in MARKS if m in marks]


def _marked_words(events: Sequence[Event], ghosts: list, selected: int | None) -> list[str]:
    """The marks the step may draw, from its events (for the key's room before the layout)."""
    kinds = {e.kind for e in events}
    words = {"prefix_hit": "prefix hit", "cache": "new hash", "load": "loaded from the tier",
             "offload": "offloaded to the tier"}
    out = [w for k, w in words.items() if k in kinds]
    return out + (["evicted"] if ghosts else []) + (["selected"] if selected is not None else [])


def _ghosts(tree: PrefixTree, events: Sequence[Event], before: PrefixTree | None,
            evicted_hashes: Collection[int] = ()) -> list[TreeNode]:
    """The nodes the step evicted and nothing keeps (not in the tier), as they were before."""
    if before is None:
        return []
    evicted = {b for e in events if e.kind == "evict" for b in e.block_ids}
    now = {n.block_hash for n in tree.nodes}
    old = before.by_block()
    gone = [old[b] for b in evicted if b in old and old[b].block_hash not in now]
    return gone + [n for n in before.nodes if n.block_hash in evicted_hashes
                   and n.block_hash not in now and n.block_id is None]


def _tokens(n: TreeNode, decode: Callable[[list[int]], str]) -> str:
    return decode(list(n.token_ids)).replace("\n", "⏎").replace("<", "‹").replace(">", "›")


def _fit(text: str, px: float, size: float) -> str:
    """`text` shortened with "…" to fit `px` at `size`."""
    if text_px(text, size) <= px:
        return text
    # the longest start that fits with the "…", in one pass (cutting a character at a time and
    # measuring again was quadratic: 80% of a watched vLLM's redraw went there)
    room, width = px - text_px("…", size), 0.0
    for i, ch in enumerate(text):
        width += text_px(ch, size)
        if width > room:
            return text[:i] + "…" if i else ""
    return text + "…"


def _where(n: TreeNode) -> str:
    """Block id, ref count or LRU place, tier slot: the cell's second line."""
    parts = []
    if n.block_id is not None:
        parts.append(f"#{n.block_id}" + (f" ×{n.ref_count}" if n.ref_count > 1 else ""))
        if n.lru is not None:
            parts.append(f"lru {n.lru}")
    if n.tier_slot is not None:
        parts.append(f"t{n.tier_slot}")
    return " ".join(parts)


def _distinct_starts(cells: Sequence[Placed], decode, fit: Callable[[str], str]) -> dict[int, int]:
    """block hash -> where its label starts: siblings whose labels, cut to their cells (`fit`),
    read alike (the students' questions after a system prompt's last words) start at the word
    where they part, so that their cells can be told apart ("…What is paging?", not each
    "in one sentence. ‹|i…")."""
    kids: dict[int | None, list[TreeNode]] = {}
    for p in cells:
        if p.node is not None:
            kids.setdefault(p.node.parent, []).append(p.node)
    out: dict[int, int] = {}
    for group in kids.values():
        if len(group) < 2:
            continue
        texts = [_tokens(n, decode) for n in group]
        if len({fit(t) for t in texts}) == len(texts):  # told apart as they are
            continue
        same = len(_common(texts))
        # at the start of the word (or line, or after a special token) where they part
        cut = max(texts[0].rfind(c, 0, same + 1) for c in " ⏎›") if same > 3 else -1
        if cut > 0:
            out.update({n.block_hash: cut + 1 for n in group})
    return out


def _common(texts: Sequence[str]) -> str:
    first = min(texts)
    last = max(texts)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


def _label(p: Placed, decode, cell_px: float, sz: ViewSizes, two_lines: bool,
           starts: dict[int, int] | None = None) -> str:
    room = cell_px - 16
    if p.node is None:
        return _fit(p.words, room, sz.font)
    start = (starts or {}).get(p.node.block_hash, 0)
    tokens = _fit(("…" if start else "") + _tokens(p.node, decode)[start:], room, sz.font)
    if not two_lines:
        return tokens
    where = "evicted" if p.kind == GHOST else _where(p.node)
    return f"{tokens}<br>{_fit(where, room, sz.font)}"


def _custom(p: Placed, decode, tree: PrefixTree) -> list:
    n = p.node
    if n is None:
        return [-1, -1, p.words]
    words = [f"block {n.block_id}" if n.block_id is not None else
             "in vLLM's cache: its events name no block id or ref count" if p.kind in (EVENTS, GHOST)
             and n.tier_slot is None else "not in the GPU pool",
             f"tokens: {_tokens(n, decode)!r}"]
    if p.kind == GHOST:
        words.append("evicted this step: its hash is gone, its slot reused")
    elif n.block_id is not None:
        words.append(f"ref count {n.ref_count}" + (" (shared)" if n.ref_count > 1 else "")
                     if n.ref_count else f"cached: {n.lru} block(s) before it in the LRU order")
    if n.tier_slot is not None:
        words.append(f"CPU tier slot t{n.tier_slot} ({n.tier_lru} before it to be overwritten)")
    words.append(f"hash {n.block_hash:016x}"
                 + (" · first block of a prompt" if n.parent is None else
                    " · its parent was evicted" if n.orphan else ""))
    return [n.block_id if n.block_id is not None and p.kind != GHOST else -1,
            n.tier_slot if n.tier_slot is not None else -1, "<br>".join(words)]


def _edges(placed, half: float) -> go.Scatter:
    """Each edge as an elbow in the gaps between cells (`half`: half a cell's width, in
    columns): from the parent's right side to the child's left side."""
    xs: list = []
    ys: list = []
    for (x0, y0), (x1, y1) in placed.edges:
        mid = x1 - 0.5
        xs += [x0 + half, mid, mid, x1 - half, None]
        ys += [y0, y0, y1, y1, None]
    return go.Scatter(**FAST, x=xs, y=ys, mode="lines", line={"color": palette.MUTED, "width": 2},
                      hoverinfo="skip", showlegend=False, name="edges")


def _outlines(placed, events: Sequence[Event], selected: int | None,
              hash_marks: Mapping[str, set[int]]) -> list[go.Scatter]:
    """A rectangle around each cell the step marked, one trace per kind of mark."""
    by_block = {p.node.block_id: p for p in placed.cells
                if p.node is not None and p.node.block_id is not None and p.kind != GHOST}
    by_slot = {p.node.tier_slot: p for p in placed.cells
               if p.node is not None and p.node.tier_slot is not None}
    marked: dict[str, list] = {k: [] for k in MARKS}
    for e in events:
        if e.kind == "prefix_hit":
            marked["prefix hit"] += [by_block.get(b) for b in e.block_ids]
        elif e.kind == "cache":
            marked["new hash"] += [by_block.get(b) for b in e.block_ids]
        elif e.kind == "load":
            marked["loaded from the tier"] += [by_block.get(b) for b in e.block_ids]
        elif e.kind == "offload":
            marked["offloaded to the tier"].append(by_slot.get(e.facts.slot))
    for words, hashes in hash_marks.items():
        if words != "evicted":
            marked[words] += [p for p in placed.cells if p.node is not None
                              and p.kind != GHOST and p.node.block_hash in hashes]
    marked["evicted"] = [p for p in placed.cells if p.kind == GHOST]
    marked["selected"] = [by_block.get(selected)] if selected is not None else []
    out = []
    for words, cells in marked.items():
        cells = [p for p in cells if p is not None]
        if not cells:
            continue
        xs: list = []
        ys: list = []
        for p in cells:
            xs += [p.x - 0.46, p.x + 0.46, p.x + 0.46, p.x - 0.46, p.x - 0.46, None]
            ys += [p.y - 0.44, p.y - 0.44, p.y + 0.44, p.y + 0.44, p.y - 0.44, None]
        out.append(go.Scatter(**FAST, x=xs, y=ys, mode="lines", name=words, hoverinfo="skip",
                              line={"color": MARKS[words], "width": 4,
                                    "dash": "dash" if words == "evicted" else "solid"}))
    return out
