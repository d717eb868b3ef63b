"""Every text of the main picture reads at 4.5:1 or more on what it is drawn on (WCAG AA), and
in presenter mode no text is under 14 px: computed from the palette and from real figures (a dry
engine through copy-on-write, prefix hits, evictions, swaps, the CPU tier and a sliding window),
trace by trace, the way plotly draws them (a heatmap's text in plotly's own contrast colour)."""

from __future__ import annotations

import re

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from viz import palette, pool_figure
from viz.pool_cells import COLOURS

AA = 4.5
SWATCH = re.compile(r"<span style='color:#[0-9a-f]{6}'>[■▭┅➜⬚⇣⇡▨]+</span>")  # colour keys, not words
BOX = (790, 650)  # presenter mode's picture at 1280 x 720


def test_plotlys_text_reads_on_every_fill_of_the_palette():
    for fill in COLOURS:
        ink = palette.plotly_text_on(fill)
        assert palette.contrast(ink, fill) >= AA, (fill, ink, round(palette.contrast(ink, fill), 2))
    for owner in palette.OWNERS:  # a row label in its owner's hue, on the white page
        assert palette.contrast(palette.readable_on_white(owner), "#ffffff") >= AA
    for fill in (palette.BORDER, "#ffffff"):  # headers, notes, the freed label
        for ink in (palette.MUTED, palette.FREED, palette.INK):
            assert palette.contrast(ink, fill) >= AA, (ink, fill)


def _engines():
    """Dry engines, after each operation, through every kind of mark the picture has."""
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=12, num_offload_blocks=8))
    a = eng.add_sequence("abcdefghij")
    b = eng.fork(a)
    eng.append(a, token_ids=[65])  # copy-on-write
    yield eng
    eng.append(b, n=3)
    eng.free(a)
    eng.free(b)  # cached blocks
    yield eng
    c = eng.add_sequence("abcdefghXY")  # a prefix hit
    yield eng
    eng.free(c)
    eng.add_sequence("zyxwvutsrqponmlkjihgfedcbaZYXWVUTSRQPONMLK")  # evictions into the CPU tier
    yield eng
    swap = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=8, num_cpu_blocks=8,
                                  preemption_mode="swap"))
    for p in ("abcdefgh", "ijklmnop", "qrstuvwx"):
        swap.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True))
    for _ in range(12):
        swap.step()
        if swap.snapshot().cpu_blocks and any(b.ref_count for b in swap.snapshot().cpu_blocks):
            break
    yield swap
    window = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=24, sliding_window=8))
    s = window.add_sequence("abcdefghijklm")
    window.append(s, n=9)
    yield window


def _fill_at(fig, x: float, y: float) -> str | None:
    """The fill of the heatmap cell under (x, y), if any (the last heatmap drawn wins)."""
    fill = None
    for t in fig.data:
        if t.type != "heatmap" or t.z is None:
            continue
        for r, yc in enumerate(t.y):
            if abs(y - yc) > 0.5:
                continue
            for c in range(len(t.x) - 1):
                if t.x[c] <= x <= t.x[c + 1] and t.z[r][c] is not None:
                    fill = COLOURS[int(t.z[r][c])]
    return fill


def _texts(fig):
    """(text, colour, background, size px) of every text the figure draws."""
    out = []
    for t in fig.data:
        if t.type == "heatmap" and t.text is not None:
            size = t.textfont.size
            for r, row in enumerate(t.text):
                for c, text in enumerate(row):
                    if text and t.z[r][c] is not None:
                        fill = COLOURS[int(t.z[r][c])]
                        ink = t.textfont.color or palette.plotly_text_on(fill)
                        out.append((text, ink, fill, size))
        elif t.type == "scatter" and t.mode == "text":
            colours = t.textfont.color
            for i, text in enumerate(t.text):
                ink = colours[i] if isinstance(colours, (list, tuple)) else colours or palette.INK
                back = _fill_at(fig, t.x[i], t.y[i]) or palette.BORDER
                out.append((text, ink, back, t.textfont.size))
    y_lo = fig.layout.yaxis.range[0]
    for n in fig.layout.annotations:
        inside = n.x >= 0 and n.y >= y_lo  # over the plot's grey, else on the white page
        back = _fill_at(fig, n.x, n.y) or (palette.BORDER if inside else "#ffffff")
        out.append((n.text, n.font.color or palette.INK, back, n.font.size))
    title = fig.layout.title
    words = SWATCH.sub("", title.text)
    sizes = [float(s) for s in re.findall(r"font-size:(\d+(?:\.\d+)?)px", words)] or [title.font.size]
    out.append((words, palette.INK, "#ffffff", min(sizes + [title.font.size])))
    return out


@pytest.mark.parametrize("large", [False, True], ids=["laptop", "presenter"])
def test_every_text_of_the_picture_reads_on_what_it_is_drawn_on(large):
    seen = set()
    for eng in _engines():
        fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode, large=large,
                          box=BOX if large else None)
        seen |= {t.name for t in fig.data}
        for text, ink, back, size in _texts(fig):
            ink = ink if ink.startswith("#") and len(ink) == 7 else palette.INK
            assert palette.contrast(ink, back) >= AA, (text, ink, back)
            if large:
                assert size >= 14 - 1e-9, (text, size)
    assert {"cpu pool", "cpu tier", "copy-on-write", "evicted", "prefix hit", "dropped entries",
            "block ids"} <= seen
