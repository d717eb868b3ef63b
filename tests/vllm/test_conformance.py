"""PagedLab against the real vLLM (CPU build, its own venv), same workloads, same settings: block
size 32, float32, greedy, the same pool and step budget, vLLM's sha256 hash chain. Each gives
token-for-token equal outputs, equal cached tokens per request (vLLM's num_cached_tokens), and
equal block hashes (vLLM's from its KV events). Where the engines differ by design, the test
says how, from what was measured, and the README's "vLLM beside PagedLab" says why.
"""

from __future__ import annotations

import pytest

from tests.vllm.conftest import BLOCK_SIZE
from tests.vllm.workloads import Req, chat, pagedlab_engine, record, run_pagedlab, run_vllm

pytestmark = pytest.mark.slow

SYSTEM = ("You are the teaching assistant of a course on operating systems and machine learning "
          "systems. Answer every question in one or two short sentences, plainly, without lists, "
          "and say so when you do not know. The students have read the PagedAttention paper and "
          "the chapters on virtual memory: paging, page tables, copy-on-write and swapping. "
          "Use their words, and give a number when the question asks for one.")
QUESTIONS = ["What is a page table?", "Why does a KV cache grow with the prompt?",
             "What does copy-on-write save?"]


def full_blocks(n_tokens: int) -> int:
    """Tokens a prefix hit can serve for a prompt of n tokens: full blocks of the first n - 1."""
    return (n_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE


def assert_same(ours, theirs) -> None:
    assert ours.outputs == theirs.outputs
    assert ours.cached == theirs.cached
    assert ours.stored == theirs.stored
    assert ours.final == theirs.final


def test_chat_requests_sharing_a_system_prompt(vllm_server, vllm_watch):
    eng = pagedlab_engine()
    reqs = [Req(chat(eng, q, SYSTEM), 24) for q in QUESTIONS]
    ours, theirs = run_pagedlab(eng, reqs), run_vllm(vllm_server, vllm_watch, reqs)
    record("chat, shared system prompt", ours, theirs)
    assert_same(ours, theirs)
    shared = len(_common_prefix([r.prompt for r in reqs])) // BLOCK_SIZE * BLOCK_SIZE
    assert ours.cached == [0, shared, shared] and shared >= 2 * BLOCK_SIZE


def test_a_long_prompt_in_chunks_then_again(vllm_server, vllm_watch):
    eng = pagedlab_engine()
    text = " ".join(f"Block {i} of the pool holds thirty-two tokens of someone's prompt." for i in
                    range(20))
    prompt = chat(eng, "Summarise this log in one line: " + text)
    assert 5 * 64 < len(prompt) < 448  # the step budget is 64 tokens: six chunks and more
    reqs = [Req(prompt, 12), Req(prompt, 12)]
    ours, theirs = run_pagedlab(eng, reqs), run_vllm(vllm_server, vllm_watch, reqs)
    record("long prompt in chunks, then again", ours, theirs)
    assert_same(ours, theirs)
    assert ours.cached == [0, full_blocks(len(prompt))]


def test_a_repeat_after_its_blocks_were_evicted(vllm_server, vllm_watch):
    eng = pagedlab_engine()
    first = chat(eng, "Explain in detail how a paged KV cache frees the blocks of a finished "
                      "request and hands them to the next one, step by step.", SYSTEM)
    others = [chat(eng, f"Count the books on these shelves of library {i}: " + " ".join(
        f"Shelf {j} of room {i} holds {j * i + 3} books." for j in range(22))) for i in range(1, 4)]
    assert sum(len(p) // BLOCK_SIZE for p in [first, *others]) > 23  # more than the pool holds
    reqs = [Req(first, 12)] + [Req(p, 8) for p in others] + [Req(first, 12)]
    ours, theirs = run_pagedlab(eng, reqs), run_vllm(vllm_server, vllm_watch, reqs)
    record("repeat after eviction", ours, theirs)
    assert ours.outputs == theirs.outputs
    assert ours.cached == theirs.cached
    assert ours.stored == theirs.stored
    assert ours.removed, "the pool was meant to be too small to keep the first request's blocks"
    assert ours.cached[-1] < full_blocks(len(first))  # the repeat found some blocks gone
    assert ours.final == theirs.final


def test_n_samples_of_one_prompt(vllm_server, vllm_watch):
    eng = pagedlab_engine()
    prompt = chat(eng, "Name three things a block table records, in a sentence.", SYSTEM)
    reqs = [Req(prompt, 36, n=3)]  # 36 tokens: each sample fills a block of its own
    ours, theirs = run_pagedlab(eng, reqs), run_vllm(vllm_server, vllm_watch, reqs)
    record("n = 3", ours, theirs)
    assert ours.outputs == theirs.outputs and len(ours.outputs[0]) == 3
    assert ours.stored == theirs.stored and ours.final == theirs.final
    # by design: PagedLab prefills the prompt once and forks it (the paper's way): nothing was
    # cached for the request. vLLM fans n out into n requests scheduled together; the later
    # ones hit the first one's prompt blocks, which vLLM caches when it allocates them
    assert ours.cached == [0]
    assert theirs.cached == [full_blocks(len(prompt))]
    # by design: vLLM keeps every physical block of the same content under its hash (each
    # sample's copy of a block it filled), publishing each; PagedLab hashes the first one only
    # and lets the others go back to the free queue unhashed (no deduplication either way)
    assert ours.copies == len(ours.final) and theirs.copies > len(theirs.final)


def _common_prefix(seqs: list[list[int]]) -> list[int]:
    out = []
    for column in zip(*seqs, strict=False):
        if len(set(column)) > 1:
            break
        out.append(column[0])
    return out
