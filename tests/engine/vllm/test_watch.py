"""VllmWatch on a ZMQ publisher in the test process that speaks vLLM's protocol (the happy path
against a real vLLM is tests/vllm/test_watch_live.py): the tree it folds from events, and each
kind of bad input, which gets a clear message while the watch keeps what it had."""

from __future__ import annotations

import http.server
import threading
import time

import msgspec
import pytest

from engine import VllmWatch
from engine.vllm.server import free_port
from tests.engine.vllm.publisher import Publisher, removed, stored


@pytest.fixture
def pub():
    p = Publisher()
    yield p
    p.close()


def joined(pub: Publisher, **kw) -> VllmWatch:
    """A watch that has subscribed (a PUB drops what it sends before the subscription lands)."""
    w = VllmWatch(pub.endpoint, pub.replay_endpoint, **kw)
    deadline = time.monotonic() + 5
    while w._events.peer != "zmq" and time.monotonic() < deadline:
        w.poll(0.05)
    time.sleep(0.2)
    return w


def drain(w: VllmWatch, n: int, most_s: float = 5.0) -> list:
    out: list = []
    deadline = time.monotonic() + most_s
    while len(out) < n and time.monotonic() < deadline:
        out += w.poll(0.1)
    return out


def edges(w: VllmWatch) -> set[tuple]:
    return {(n.parent, n.block_hash, n.depth, n.orphan) for n in w.tree().nodes}


def test_events_fold_into_vllms_tree(pub):
    with joined(pub) as w:
        pub.publish(stored([11, 12], None), stored([21], 11, first_token=10))
        pub.publish(stored([11], None))  # a second physical block of the same content
        pub.publish(removed([11, 12]))  # one copy of 11 goes, and 12
        got = drain(w, 4)
        assert [e.kind for e in got] == ["stored", "stored", "stored", "removed"]
        assert got[0].blocks() == [(11, None, (0, 1)), (12, 11, (2, 3))]
        assert edges(w) == {(None, 11, 0, False), (11, 21, 1, False)}
        tree = w.tree()
        assert all(n.block_id is None and n.ref_count == 0 for n in tree.nodes)
        assert [n.block_hash for n in tree.nodes] == [11, 21]  # parents first
        pub.publish(removed([11]), removed([99]))  # the last copy of 11; 99 was never stored
        drain(w, 2)
        assert edges(w) == {(11, 21, 1, True)}  # an orphan: its parent was evicted
        c = w.counts()
        assert (c.blocks, c.stored, c.removed, c.unknown_removed, c.batches) == (1, 4, 4, 1, 4)
        assert [(m.stored, m.removed) for m in w.timeline()] == [(3, 0), (1, 0), (0, 2), (0, 2)]
        assert not w.problems


def test_bytes_hashes_and_other_media(pub):
    digest = bytes(range(32))
    as_int = int.from_bytes(digest[-8:], "big")
    with joined(pub) as w:
        pub.publish(stored([digest], None), stored([5], None, medium="CPU"))
        drain(w, 2)
        assert [n.block_hash for n in w.tree().nodes] == [as_int]
        assert w.counts().other_medium == 1
        from engine.vllm.schema import AllBlocksCleared

        pub.publish(AllBlocksCleared())
        drain(w, 1)
        assert w.tree().nodes == () and w.counts().cleared == 1


def test_a_gap_is_replayed_from_vllms_replay_endpoint(pub):
    with joined(pub) as w:
        pub.publish(stored([1], None))
        drain(w, 1)
        pub.publish(stored([2], 1), drop=True)
        pub.publish(stored([3], 2), drop=True)
        pub.publish(stored([4], 3))
        got = drain(w, 3)
        assert [e.seq for e in got] == [1, 2, 3] and not w.problems
        assert {n.block_hash for n in w.tree().nodes} == {1, 2, 3, 4}


def test_a_watch_that_joins_late_replays_from_the_start(pub):
    pub.publish(stored([1], None))  # nobody listens yet
    with joined(pub) as w:  # it catches up as soon as it has joined, before any new message
        assert w.mirror.batches == 1 and edges(w) == {(None, 1, 0, False)}
        pub.publish(stored([2], 1))
        drain(w, 1)
        assert w.mirror.batches == 2 and edges(w) == {(None, 1, 0, False), (1, 2, 1, False)}


def test_a_gap_the_replay_buffer_no_longer_holds():
    pub = Publisher(buffer=2)
    try:
        with joined(pub) as w:
            pub.publish(stored([1], None))
            drain(w, 1)
            pub.publish(stored([2], 1), drop=True)
            pub.publish(stored([3], 2), drop=True)  # the buffer keeps this one and the next
            pub.publish(stored([4], 3))
            drain(w, 2)
            [p] = w.problems
            assert p.kind == "gap" and "messages 1..2" in p.message
            assert "no longer holds 1 of them" in p.message
            assert {n.block_hash for n in w.tree().nodes} == {1, 3, 4}  # kept what it had
    finally:
        pub.close()


def test_a_replay_endpoint_that_does_not_answer():
    pub = Publisher(replay=False)
    dead = f"tcp://127.0.0.1:{free_port()}"
    try:
        with VllmWatch(pub.endpoint, dead, replay_timeout_s=0.5) as w:
            deadline = time.monotonic() + 5
            while w._events.peer != "zmq" and time.monotonic() < deadline:
                w.poll(0.05)
            time.sleep(0.2)
            pub.publish(stored([1], None))
            drain(w, 1)
            pub.publish(stored([2], 1), drop=True)
            pub.publish(stored([3], 2))
            drain(w, 1)
            join, gap = w.problems  # it could not catch up when it joined, nor fill the gap
            assert "could not catch up" in join.message and "did not answer in 0.5 s" in join.message
            assert gap.kind == "gap" and "did not answer in 0.5 s" in gap.message
            assert {n.block_hash for n in w.tree().nodes} == {1, 3}
    finally:
        pub.close()


def test_a_gap_without_a_replay_endpoint():
    pub = Publisher(replay=False)
    try:
        with joined(pub) as w:
            pub.publish(stored([1], None))
            drain(w, 1)
            pub.publish(stored([2], 1), drop=True)
            pub.publish(stored([3], 2))
            drain(w, 1)
            assert [p.kind for p in w.problems] == ["gap"]
            assert "no replay endpoint" in w.problems[0].message
    finally:
        pub.close()


class _OldEvent(msgspec.Struct, array_like=True, tag=True):  # vLLM's example subscriber's layout
    pass


class _OldStored(_OldEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


def test_frames_of_another_schema_are_skipped_with_a_message(pub):
    with joined(pub) as w:
        pub.publish(stored([1], None))
        drain(w, 1)
        before = edges(w)
        old = msgspec.msgpack.encode([time.time(), [_OldStored([2], 1, [0, 1], 2, None, "GPU")]])
        pub.send_raw([b"", (1).to_bytes(8, "big"), old])
        pub.send_raw([b"", (2).to_bytes(8, "big"), b"\x93not msgpack"])
        pub.send_raw([b"", b"\x00\x01"])
        pub.send_raw([b"", b"\x00", b"payload"])
        pub.seq = 3
        pub.publish(stored([4], 1))
        drain(w, 1)
        kinds = [p.kind for p in w.problems]
        assert kinds == ["schema"] * 4, w.problems
        assert "vLLM 0.32.0" in w.problems[0].message and "skipped" in w.problems[0].message
        assert "vLLM sends 3" in w.problems[2].message
        assert edges(w) == before | {(1, 4, 1, False)}


def test_a_restarted_vllm_starts_the_picture_afresh(pub):
    with joined(pub) as w:
        pub.publish(stored([1], None))
        pub.publish(stored([2], 1))
        drain(w, 2)
        pub.seq = 0
        pub.buffer.clear()
        pub.publish(stored([7], None))
        drain(w, 1)
        assert [p.kind for p in w.problems] == ["restart"]
        assert {n.block_hash for n in w.tree().nodes} == {7}


def test_an_endpoint_where_nothing_listens():
    with VllmWatch(f"tcp://127.0.0.1:{free_port()}", silence_s=0.5) as w:
        deadline = time.monotonic() + 5
        while not w.problems and time.monotonic() < deadline:
            w.poll(0.1)
        [p] = w.problems
        assert p.kind == "no answer" and "nothing answered" in p.message
        assert w.status() == p.message and w.tree().nodes == ()


def test_a_vllm_without_events_is_silent():
    pub = Publisher(replay=False)  # a ZMQ peer that never publishes
    try:
        with VllmWatch(pub.endpoint, silence_s=0.5) as w:
            deadline = time.monotonic() + 5
            while not w.problems and time.monotonic() < deadline:
                w.poll(0.1)
            assert [p.kind for p in w.problems] == ["silent"]
            assert "--kv-events-config" in w.problems[0].message
    finally:
        pub.close()


def test_a_bound_watch_that_no_vllm_connects_to():
    with VllmWatch(f"tcp://127.0.0.1:{free_port()}", bind=True, silence_s=0.3) as w:
        time.sleep(0.35)
        w.poll(0.05)
        assert [p.kind for p in w.problems] == ["no answer"]
        assert "no vLLM connected" in w.problems[0].message


def test_an_http_server_is_not_a_zmq_peer():
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with VllmWatch(f"tcp://127.0.0.1:{server.server_port}", silence_s=30) as w:
            deadline = time.monotonic() + 5
            while not w.problems and time.monotonic() < deadline:
                w.poll(0.1)
            assert [p.kind for p in w.problems] == ["not zmq"]
    finally:
        server.shutdown()


@pytest.mark.parametrize("endpoint", ["localhost:5557", "tcp://host", "tcp://h:99999", "", None])
def test_bad_endpoints_are_refused(endpoint):
    with pytest.raises(ValueError, match="tcp://HOST:PORT|between 1 and 65535"):
        VllmWatch(endpoint)
    with pytest.raises(ValueError, match="replay_endpoint"):
        VllmWatch("tcp://127.0.0.1:5557", replay_endpoint="5558")


def test_a_port_taken_cannot_be_bound_and_a_closed_watch_says_so(pub):
    with pytest.raises(ValueError, match="could not bind"):
        VllmWatch(pub.endpoint, bind=True)
    w = VllmWatch(pub.endpoint)
    w.close()
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.poll()
