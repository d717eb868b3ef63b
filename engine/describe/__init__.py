"""What describes a run, above the bookkeeping: the snapshot callers read, each event's sentence
(`narrate`), the request timeline, the prefix cache as a tree, memory over time, the contiguous
baselines paging is measured against, and byte counts for people.

The bookkeeping (`engine.core`) never imports this package: it keeps ids and numbers (events
carry named facts), and a view is written from them here when someone reads it. Pure Python,
like the bookkeeping: neither torch nor numpy (tests/engine/core/test_torch_free.py).
"""

from engine.describe.narration import narrate

__all__ = ["narrate"]
