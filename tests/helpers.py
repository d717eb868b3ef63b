"""Shared test helpers (no fixtures: those live in conftest.py): a full fingerprint of the block
bookkeeping. Whether the Triton kernels run in this process is tests/kernels/triton_mode.py's."""

from engine import LLMEngine


def fingerprint(eng: LLMEngine) -> tuple:
    """Everything the bookkeeping holds, orders included: equal fingerprints = identical state."""
    pool = eng.kv.pool
    return (
        eng.snapshot(),
        tuple(pool.free_ids),
        tuple(pool.cached_ids),
        tuple(sorted(pool.hash_to_block.items())),
        tuple((s.seq_id, tuple(s.block_hashes), s.pending_token) for s in eng.seqs.values()),
        eng._rng.getstate(),
        eng.registry.next_seq_id,
    )

