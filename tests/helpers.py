"""Shared test helpers (no fixtures): a full fingerprint of the block bookkeeping; whether the
Triton kernels run in this test process."""

import torch

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
        eng._next_seq_id,
    )


def triton_runs_here(imported_before: bool) -> bool:
    """Whether Triton kernels run in this test process: on CUDA, or under the interpreter when
    it was switched on before triton was first imported (`imported_before`: triton was already
    in sys.modules when the calling test module started; then only a check of how triton
    defined its own functions tells)."""
    from kernels import interpreter_enabled, triton_available

    if not triton_available():
        return False
    if torch.cuda.is_available():
        return True
    if not interpreter_enabled():
        return False
    if not imported_before:
        return True
    import triton.language as tl

    return type(tl.cdiv).__name__ == "InterpretedFunction"
