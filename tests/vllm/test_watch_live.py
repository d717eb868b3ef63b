"""VllmWatch against a real vLLM server: the OpenAI API on loopback gets chat requests, the watch
follows the server's KV events, and its tree is the one PagedLab builds for the same tokens
with vLLM's hash chain. A watch that was away replays what it missed from vLLM's replay
endpoint; a watch pointed at the HTTP port says that it does not speak ZMQ."""

from __future__ import annotations

import time

import pytest

from engine import VllmWatch
from engine.describe.prefix_tree import PrefixTree
from tests.vllm.conftest import settle
from tests.vllm.workloads import Req, chat, pagedlab_engine, run_pagedlab

pytestmark = pytest.mark.slow

SYSTEM = ("You are a librarian in a large public library. You answer questions about books, "
          "authors and the library's rules in one or two sentences, kindly, and you never invent "
          "a title: when you do not know, you say so and suggest asking at the front desk.")


def edges(tree: PrefixTree) -> set[tuple]:
    return {(n.parent, n.block_hash, n.token_ids, n.depth) for n in tree.nodes}


def test_the_watch_draws_vllms_cache_as_pagedlab_would(vllm_server, vllm_watch):
    eng = pagedlab_engine()
    reqs = [Req(chat(eng, q, SYSTEM), 20) for q in ("Who wrote Dune?", "What is an index?")]
    vllm_server.reset_prefix_cache()  # published with the next step's events
    for r in reqs:
        vllm_server.complete(r.prompt, r.max_tokens)
    settle(vllm_watch)
    run_pagedlab(eng, reqs)
    tree = vllm_watch.tree()
    assert isinstance(tree, PrefixTree) and len(tree.nodes) >= 3
    assert edges(tree) == edges(eng.prefix_tree())
    # what events cannot show stays empty, and the tree has the shared trunk
    assert all(n.block_id is None and n.ref_count == 0 and n.lru is None for n in tree.nodes)
    roots = [n for n in tree.nodes if n.parent is None]
    assert len(roots) == 1 and sum(n.parent == roots[0].block_hash for n in tree.nodes) >= 1
    c = vllm_watch.counts()
    assert c.blocks == len(tree.nodes) and c.cleared >= 1 and not vllm_watch.problems


def test_a_watch_that_was_away_replays_what_it_missed(vllm_server):
    eng = pagedlab_engine()
    # 32 new tokens: each request fills a block of its own past the shared system prompt, so
    # each sends vLLM's watchers a message (a request whose blocks all hit sends none)
    reqs = [Req(chat(eng, f"Name a book about {topic}, and say why.", SYSTEM), 32)
            for topic in ("ships", "stars", "trains")]
    with VllmWatch(vllm_server.events_endpoint, vllm_server.replay_endpoint,
                   silence_s=300) as w:
        vllm_server.reset_prefix_cache()
        vllm_server.complete(reqs[0].prompt, reqs[0].max_tokens)
        settle(w)
        seen = w.last_seq
    vllm_server.complete(reqs[1].prompt, reqs[1].max_tokens)  # while no watch listens
    with VllmWatch(vllm_server.events_endpoint, vllm_server.replay_endpoint,
                   silence_s=300) as late:
        deadline = time.monotonic() + 30
        while late.last_seq <= seen and time.monotonic() < deadline:
            late.poll(0.2)  # vLLM connects; the watch asks its replay endpoint what it missed
        assert late.last_seq > seen  # request 1's messages, sent while no watch listened
        vllm_server.complete(reqs[2].prompt, reqs[2].max_tokens)
        settle(late)
        # it read every message vLLM sent (replayed or live) and knows the cache as the first
        # watch would have
        assert late.mirror.batches == late.last_seq + 1
        assert not [p for p in late.problems if p.kind == "gap"], late.problems
        run_pagedlab(eng, reqs)
        assert edges(late.tree()) == edges(eng.prefix_tree())


def test_the_http_port_is_not_the_event_endpoint(vllm_server):
    http = vllm_server.url.replace("http://", "tcp://")
    with VllmWatch(http, silence_s=30) as w:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not w.problems:
            w.poll(0.5)
        assert [p.kind for p in w.problems] == ["not zmq"]
        assert "does not speak ZMQ" in w.status() and w.tree().nodes == ()
