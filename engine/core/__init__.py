"""The bookkeeping of the paged KV cache, as in the paper: blocks, block tables, ref counts,
copy-on-write, prefix hashing, sequences, the scheduler, beams, events and snapshots.

Pure Python: this package imports neither torch nor numpy (tests/engine/core proves it), so it
reads like the paper and runs anywhere, with or without a model.
"""
