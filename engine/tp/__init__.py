"""Tensor parallelism (paper §4.6): N worker processes, each holding a shard of every layer's
heads and a KV pool indexed by the same block ids; the engine process keeps the bookkeeping."""
