"""How wide a text is drawn, in pixels, so that a picture can size its cells before the browser
draws them. The widths are DejaVu Sans's advance widths (per 1000 of the font size), the widest
of the usual sans-serif fonts and the one a Debian browser falls back to: a cell sized by them
holds the text in any narrower font too. A character outside ASCII counts as a whole em (most
symbols and letters of other scripts are at most that wide)."""

from __future__ import annotations

# advance widths of " " (32) to "~" (126), per 1000 em: regular, then bold
_REGULAR = (
    318, 401, 460, 838, 636, 950, 780, 275, 390, 390, 500, 838, 318, 361, 318, 337, 636, 636,
    636, 636, 636, 636, 636, 636, 636, 636, 337, 337, 838, 838, 838, 531, 1000, 684, 686, 698,
    770, 632, 575, 775, 752, 295, 295, 656, 557, 863, 748, 787, 603, 787, 695, 635, 611, 732,
    684, 989, 685, 611, 685, 390, 337, 390, 838, 500, 500, 613, 635, 550, 635, 615, 352, 635,
    634, 278, 278, 579, 278, 974, 634, 612, 635, 635, 411, 521, 392, 634, 592, 818, 592, 592,
    525, 636, 337, 636, 838,
)
_BOLD = (
    348, 456, 521, 838, 696, 1002, 872, 306, 457, 457, 523, 838, 380, 415, 380, 365, 696, 696,
    696, 696, 696, 696, 696, 696, 696, 696, 400, 400, 838, 838, 838, 580, 1000, 774, 762, 734,
    830, 683, 683, 821, 837, 372, 372, 775, 637, 995, 837, 850, 733, 850, 770, 720, 682, 812,
    774, 1103, 771, 724, 725, 457, 365, 457, 838, 500, 500, 675, 716, 593, 716, 678, 435, 716,
    712, 343, 343, 665, 343, 1042, 712, 687, 716, 716, 493, 595, 478, 712, 652, 924, 645, 652,
    582, 712, 365, 712, 838,
)
_NARROW = {"…": 1000, "▸": 502, "×": 838, "·": 318, "ˢ": 373, "–": 500, "—": 1000, "→": 838}


def text_px(text: str, size: float, bold: bool = False) -> float:
    """The width of `text` set in `size` px type."""
    table = _BOLD if bold else _REGULAR
    total = 0
    for ch in text:
        code = ord(ch)
        total += table[code - 32] if 32 <= code < 127 else _NARROW.get(ch, 1000)
    return total * size / 1000
