"""Narration reads as English for one and for many (issue 23: "(block 2 stay cached)",
"1 blocks"): the exact sentences for 1 and for 2."""

from __future__ import annotations

from engine.core.events import Allocated, Computed, Event, Freed, Preempted, Prefilled, PrimitivePrefill
from engine.describe.narration import narrate, plural


def test_plural() -> None:
    assert plural(1, "block") == "1 block"
    assert plural(2, "block") == "2 blocks"
    assert plural(0, "block") == "0 blocks"
    assert plural(1, "KV head") == "1 KV head"
    assert plural(3, "query", "queries") == "3 queries"


def test_free_says_stays_for_one_cached_block_and_stay_for_two() -> None:
    one = Event("free", 3, 0, block_ids=(2,), facts=Freed((2,), ()))
    assert narrate(one) == "seq 0 freed: block 2 back in the pool (block 2 stays cached)"
    two = Event("free", 3, 0, block_ids=(2, 3), facts=Freed((2, 3), (5,)))
    assert narrate(two) == ("seq 0 freed: blocks 2, 3 back in the pool (blocks 2, 3 stay cached); "
                            "block 5 still used by others (ref count - 1)")


def test_counts_in_sentences_agree_with_their_noun() -> None:
    cases = [
        (Event("allocate", 1, 0, block_ids=(4,), facts=Allocated(1), form="allocate_many"),
         "seq 0 got block 4 for 1 token"),
        (Event("allocate", 1, 0, block_ids=(4, 5), facts=Allocated(2), form="allocate_many"),
         "seq 0 got blocks 4, 5 for 2 tokens"),
        (Event("decode", 1, None, block_ids=(0,)), "decode: 1 sequence computed one token"),
        (Event("decode", 1, None, block_ids=(0, 1)), "decode: 2 sequences computed one token each"),
        (Event("decode", 1, 0, token_ids=(7,), facts=Computed(1), form="decode_primitive",
               names=lambda t: "'x'"),
         "seq 0: the model computed 1 token; next token 'x' waits as pending"),
        (Event("decode", 1, 0, token_ids=(7,), facts=Computed(2), form="decode_primitive",
               names=lambda t: "'x'"),
         "seq 0: the model computed 2 tokens; next token 'x' waits as pending"),
        (Event("prefill", 1, 0, facts=PrimitivePrefill(1, 1, 0), form="prefill_primitive"),
         "seq 0: prefill of 1 prompt token, 1 computed"),
        (Event("prefill", 1, 0, facts=PrimitivePrefill(2, 2, 0), form="prefill_primitive"),
         "seq 0: prefill of 2 prompt tokens, 2 computed"),
        (Event("prefill", 1, 0, facts=Prefilled(False, True, True, 0, 1, 1, 0, 0)),
         "seq 0: prefill of 1 token, 1 computed, 0 from the prefix cache"),
        (Event("prefill", 1, 0, facts=Prefilled(False, True, True, 0, 2, 2, 0, 0)),
         "seq 0: prefill of 2 tokens, 2 computed, 0 from the prefix cache"),
        (Event("preempt", 1, None, facts=Preempted(0, (0,), 1, False)),
         "out of blocks: request 0 (seq 0) preempted by swap (1 block to CPU)"),
        (Event("preempt", 1, None, facts=Preempted(0, (0, 1), 2, False)),
         "out of blocks: request 0 (seq 0, 1) preempted by swap (2 blocks to CPU)"),
    ]
    for event, sentence in cases:
        assert narrate(event) == sentence


def test_a_freed_sequence_with_one_cached_block_reads_stays() -> None:
    from engine import EngineConfig, LLMEngine

    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=8))
    a = eng.add_sequence("abcdef")  # one full block (hashed into the cache) and one partial
    eng.free(a)
    texts = [narrate(e) for e in eng.last_events]
    assert any("(block 0 stays cached)" in t for t in texts), texts
    assert not any("stay cached" in t for t in texts)
