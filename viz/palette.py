"""The teaching theme: colours shared by the figures and the HTML panels, so a sequence has one
colour everywhere.

Owner colours are Okabe-Ito / Paul Tol hues chosen to stay apart for deuteranopes (the common
red-green colour blindness): tests/viz/test_figures.py simulates deuteranopia (Machado et al. 2009) and
checks every pair of owner colours, and each against the shared / cached / free colours.
"""

from __future__ import annotations

FREE = "#ffffff"  # a free block, and an empty slot of any block
CACHED = "#b5b9bf"  # darker than the plot background that draws the cell borders
SHARED = "#f0e442"  # a block with ref count > 1
PENDING = "#dfe8f5"  # the slot the pending token will take
BORDER = "#dde1e6"  # plot background: shows through the gaps between slots and blocks
INK = "#1f2933"  # text
MUTED = "#4b5563"  # 5.7:1 on the picture's grey background, 7.5:1 on white
# Okabe-Ito's hues, a few made a shade lighter or darker so that the text drawn on them (white on
# the dark ones, the picture's grey ink on the light ones: plotly's own choice) reads at 4.5:1 or
# more (tests/viz/test_contrast.py)
OWNERS = ("#0072b2", "#eea400", "#008460", "#bb4d8a", "#68bceb", "#be5400", "#332288", "#882255")
NEW = "#117733"  # outline of a block allocated in the last step
PREFIX_HIT = "#b8860b"
EVICT = "#b2182b"  # red, dashed (a prefix hit is gold and solid)
FREED = "#4a5059"  # a block the last step gave back
RESERVED = "#d5d9df"  # blocks a teacher holds back from the class: grey, no owner colour
COW = "#111111"
SWAP = "#6a3d9a"
DRAFT = "#7b3294"  # the slot of a draft token the model kept (speculative decoding)
REJECTED = "#c51b7d"  # a rejected draft token, struck out in the slot it gave back
SELECT = "#111111"
DROPPED = "#eef0f3"  # a table entry a sliding window dropped: lighter than the plot, not white
HATCH = "#b9bfc7"  # the hatching over a dropped entry
OFFLOAD = "#8c510a"  # a cached block's K/V copied to the prefix cache's CPU tier
LOAD = "#01665e"  # a prompt block copied back from the CPU tier

# Machado, Oliveira & Fernandes (2009), deuteranopia at severity 1.0, on linear RGB
_DEUTERANOPIA = ((0.367322, 0.860646, -0.227968),
                 (0.280085, 0.672501, 0.047413),
                 (-0.011820, 0.042940, 0.968881))


def owner_colour(seq_id: int) -> str:
    return OWNERS[seq_id % len(OWNERS)]


def _linear(c: float) -> float:
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _srgb(c: float) -> float:
    c = min(1.0, max(0.0, c))
    return 12.92 * c if c <= 0.0031308 else 1.055 * c ** (1 / 2.4) - 0.055


def deuteranopia(hex_colour: str) -> tuple[float, float, float]:
    """The sRGB colour (0..1) a deuteranope sees for `hex_colour`."""
    rgb = [_linear(int(hex_colour[i:i + 2], 16) / 255) for i in (1, 3, 5)]
    return tuple(_srgb(sum(m * c for m, c in zip(row, rgb, strict=True))) for row in _DEUTERANOPIA)


def lab(rgb: tuple[float, float, float]) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB colour given as 0..1 floats."""
    r, g, b = (_linear(c) for c in rgb)
    xyz = (0.4124 * r + 0.3576 * g + 0.1805 * b, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           0.0193 * r + 0.1192 * g + 0.9505 * b)
    f = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116
         for t in (xyz[0] / 0.95047, xyz[1], xyz[2] / 1.08883)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def luminance(colour: str) -> float:
    """WCAG relative luminance of a "#rrggbb" colour."""
    r, g, b = (_linear(int(colour[i:i + 2], 16) / 255) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two "#rrggbb" colours (1 to 21)."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def plotly_text_on(fill: str) -> str:
    """The colour plotly draws a heatmap's text in on `fill` (its Color.contrast: white on a
    dark fill by tinycolor's brightness, its default line grey #444 on a light one)."""
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return "#ffffff" if (299 * r + 587 * g + 114 * b) / 1000 < 128 else "#444444"


def readable_on_white(colour: str) -> str:
    """`colour` darkened just enough to read at 4.5:1 on white (a row label in its owner's hue)."""
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    while contrast(f"#{r:02x}{g:02x}{b:02x}", "#ffffff") < 4.6:
        r, g, b = (int(v * 0.92) for v in (r, g, b))
    return f"#{r:02x}{g:02x}{b:02x}"


def text_on(fill: str) -> str:
    """White or ink, whichever reads better on `fill` (the block ids drawn on their blocks)."""
    return "#ffffff" if contrast("#ffffff", fill) >= contrast(INK, fill) else INK


def is_dark(colour: str) -> bool:
    """Whether white text reads better than ink on this "#rrggbb" colour (relative luminance)."""
    r, g, b = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45
