"""check_invariants() must catch every kind of corruption it claims to check."""

import pytest

from engine import EngineConfig, InvariantError, LLMEngine


def engine_with_sharing() -> LLMEngine:
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=8))
    a = eng.add_sequence([1, 2, 3, 4, 5, 6])
    eng.fork(a)
    b = eng.add_sequence([1, 2, 3, 4, 9])
    eng.free(b)
    eng.check_invariants()
    return eng


def corrupt_ref_count(e):
    e.kv.pool.blocks[0].ref_count += 1


def corrupt_owners(e):
    e.kv.pool.blocks[0].owners[42] = None


def corrupt_table_length(e):
    e.seqs[0].block_table.append(5)


def corrupt_duplicate_entry(e):
    e.seqs[0].block_table[1] = e.seqs[0].block_table[0]


def corrupt_block_tokens(e):
    e.kv.pool.blocks[0].token_ids[0] = 77


def corrupt_free_queue(e):
    e.kv.pool.free_ids.append(e.kv.pool.free_ids[0])


def corrupt_state(e):
    e.kv.pool.free_ids.remove(7)


def corrupt_partial_hash(e):
    blk = e.kv.pool.blocks[e.seqs[0].block_table[-1]]
    blk.block_hash = 123


def corrupt_hash_map(e):
    e.kv.pool.hash_to_block[(0, 999)] = 0


def corrupt_seq_registry(e):
    e.seqs[5] = e.seqs.pop(1)


@pytest.mark.parametrize("corrupt", [
    corrupt_ref_count, corrupt_owners, corrupt_table_length, corrupt_duplicate_entry,
    corrupt_block_tokens, corrupt_free_queue, corrupt_state, corrupt_partial_hash,
    corrupt_hash_map, corrupt_seq_registry,
])
def test_corruption_is_caught(corrupt):
    eng = engine_with_sharing()
    corrupt(eng)
    with pytest.raises(InvariantError):
        eng.check_invariants()
