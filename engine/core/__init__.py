"""The bookkeeping of the paged KV cache, as in the paper: blocks, block tables, ref counts,
copy-on-write, prefix hashing, sequences, the scheduler, beams, and the events that report what
it did (ids and named facts). What describes a run (snapshots, sentences, the timeline, the prefix
tree, memory over time) lives above it, in engine/describe, which this package never imports.

Pure Python: this package imports neither torch nor numpy (tests/engine/core proves it), so it
reads like the paper and runs anywhere, with or without a model.
"""
