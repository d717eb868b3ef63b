"""Colours shared by the figures and the HTML panels, so a sequence has one colour everywhere."""

FREE = "#ffffff"
CACHED = "#a3a3a3"  # darker than the plot background (#d0d0d0) that draws the cell borders
SHARED = "#f2b134"  # a block with ref count > 1
OWNERS = ("#4c78a8", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d", "#79706e", "#d67195",
          "#2f8f9d", "#8c6bb1")
NEW = "#1a9850"  # outline of a block allocated in the last step
PREFIX_HIT = "#d4a000"
EVICT = "#d62728"
COW = "#ff7f0e"
SWAP = "#7b4fa6"


def owner_colour(seq_id: int) -> str:
    return OWNERS[seq_id % len(OWNERS)]
