"""VllmWatch: PagedLab watching a real vLLM's prefix cache through its KV events.

    watch = VllmWatch("tcp://gpu-box:5557", replay_endpoint="tcp://gpu-box:5558")
    new = watch.poll(0.5)      # the events that arrived (engine.vllm.schema.VllmEvent)
    tree = watch.tree()        # the same type as LLMEngine.prefix_tree()
    watch.problems             # what went wrong, each a sentence; the watch keeps what it had
    watch.close()

vLLM publishes a message per step that changed its cache, numbered from 0. A gap in the numbers
(a slow reader past the high-water mark, a watch started after vLLM) is filled from vLLM's
replay endpoint when one is given, as vLLM's example subscriber does; what cannot be replayed is
named in a problem. Nothing bad in the stream stops the watch: a message of another schema is
skipped and named, a missing peer or a silent one is named once, and the mirror keeps what it
had. One thread at a time: `poll` reads the sockets in the caller's thread (no thread of its own).
Events carry hashes and tokens, never physical block ids, block tables or ref counts.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import zmq

from engine.describe.prefix_tree import PrefixTree
from engine.vllm.link import EventSocket, ReplayClient, check_endpoint
from engine.vllm.mirror import BatchMark, CacheMirror, WatchCounts
from engine.vllm.schema import SchemaError, VllmEvent, decode_batch

#: events one poll takes at most, so a flood cannot hold the caller for long
MAX_MESSAGES_PER_POLL = 50_000
MAX_PROBLEMS = 100

CANNOT_SHOW = ("vLLM's KV events name blocks by their hash and tokens only: they never carry "
               "physical block ids, block tables or reference counts, so this view cannot show "
               "which physical block holds a prefix, which request holds which block, or how "
               "many requests share one.")


@dataclass(frozen=True)
class WatchProblem:
    """Something the watch could not do or read. kind: "no answer" (nothing listens or
    connects), "not zmq" (the peer does not speak ZMQ), "silent" (connected, no events),
    "schema" (a message of another schema), "gap" (messages lost), "restart" (vLLM began
    numbering again)."""

    kind: str
    message: str
    seq: int | None = None


class VllmWatch:
    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, bind: bool = False,
                 replay_timeout_s: float = 2.0, silence_s: float = 10.0) -> None:
        """Subscribe to the KV events vLLM publishes at `endpoint` (`bind`: listen there for a
        vLLM whose endpoint has no `*`, which then connects), replaying gaps from
        `replay_endpoint` (vLLM's `replay_endpoint`) when given. `silence_s`: how long without a
        peer or an event before a problem says so."""
        check_endpoint("endpoint", endpoint)
        if replay_endpoint is not None:
            check_endpoint("replay_endpoint", replay_endpoint)
        self.endpoint, self.replay_endpoint, self.silence_s = endpoint, replay_endpoint, silence_s
        self._ctx = zmq.Context()
        try:
            self._events = EventSocket(self._ctx, endpoint, bind)
        except ValueError:
            self._ctx.term()
            raise
        self._replay = (ReplayClient(self._ctx, replay_endpoint, replay_timeout_s)
                        if replay_endpoint else None)
        self.mirror = CacheMirror()
        self.last_seq = -1
        self.problems: deque[WatchProblem] = deque(maxlen=MAX_PROBLEMS)
        self._said: set[str] = set()
        self._problem_at = 0  # messages applied when the last problem was noted
        self._started = time.monotonic()
        self.opened_at = time.time()  # when this subscription began (the tab's picture says it)
        self._last_message: float | None = None
        self.closed = False

    # ---- the public face ----------------------------------------------------------------------

    def poll(self, timeout_s: float = 0.0) -> list[VllmEvent]:
        """The events that arrived: waits up to `timeout_s` for a message, then takes every
        message already queued (at most MAX_MESSAGES_PER_POLL)."""
        if self.closed:
            raise ValueError("this VllmWatch is closed")
        out: list[VllmEvent] = []
        sub = self._events.sub
        if sub.poll(max(0, int(timeout_s * 1000))):
            for _ in range(MAX_MESSAGES_PER_POLL):
                try:
                    frames = sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._last_message = time.monotonic()
                self._take(frames, out)
        events = self._events
        was = events.peer
        events.read_monitor()
        if events.peer == "zmq" and was != "zmq":
            self._catch_up(out)
        self._check_peer()
        return out

    @property
    def joined(self) -> bool:
        """Whether a peer speaking ZMQ is connected (vLLM's publisher, once the handshake is
        done: the watch then catches up with what it missed, when it has a replay endpoint)."""
        return self._events.peer == "zmq"

    def catch_up(self) -> list[VllmEvent]:
        """The messages vLLM sent after the last one taken, asked of its replay endpoint now (no
        replay endpoint: none). A caller that must know the cache as it is at a moment (after a
        request's answer, say) calls it: a PUB drops what it sends while a subscription is still
        on its way, and a message so lost is otherwise taken only when a later one shows the gap."""
        if self.closed:
            raise ValueError("this VllmWatch is closed")
        out: list[VllmEvent] = []
        self._catch_up(out)
        return out

    def tree(self, group: int = 0) -> PrefixTree:
        """vLLM's prefix cache as a tree (engine/describe/prefix_tree.py's type), from the events so
        far; fields events cannot fill are empty (block_id None, ref_count 0, no LRU place)."""
        return self.mirror.tree(group)

    def counts(self) -> WatchCounts:
        return self.mirror.counts()

    def timeline(self) -> list[BatchMark]:
        """What each message did (blocks stored, removed, a reset), oldest first."""
        return list(self.mirror.timeline)

    @property
    def problem(self) -> WatchProblem | None:
        """The newest problem, while it still holds: a peer judged not to speak ZMQ (its greeting
        late, on a loaded machine) that then did is no longer one, nor silence once messages came."""
        last = self.problems[-1] if self.problems else None
        if last is not None and (last.kind == "not zmq" and self.joined or
                                 last.kind in ("silent", "no answer") and self.mirror.batches):
            return None
        return last

    def status(self) -> str:
        """One sentence: where the watch stands."""
        c = self.mirror.counts()
        if self.problem is not None and c.batches == 0:
            return self.problem.message
        fresh = self.problems and self._problem_at >= c.batches  # no message came after it
        return (f"watching {self.endpoint}: {c.events} events in {c.batches} messages, "
                f"{c.blocks} blocks in vLLM's prefix cache now"
                + (f"; {self.problems[-1].message}" if fresh else ""))

    def close(self) -> None:
        """End the subscription (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._events.close()
        if self._replay is not None:
            self._replay.close()
        self._ctx.term()

    def __enter__(self) -> VllmWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- messages ------------------------------------------------------------------------------

    def _take(self, frames: list[bytes], out: list[VllmEvent]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self._problem("schema", f"a message of {len(frames)} frame(s) "
                          f"{[len(f) for f in frames]} bytes: vLLM sends 3 (topic, an 8-byte "
                          f"sequence number, the payload); skipped")
            return
        seq = int.from_bytes(frames[1], "big")
        if seq <= self.last_seq:
            if seq == 0:  # a new vLLM (or a restarted one) numbers from 0 with an empty cache
                self._problem("restart", f"vLLM at {self.endpoint} began numbering its messages "
                              f"again (0 after {self.last_seq}): it restarted; the picture "
                              f"starts afresh", seq)
                self.mirror.apply([VllmEvent("cleared", seq, 0.0)])
                self.last_seq = -1
            else:
                return  # already taken from a replay
        if seq > self.last_seq + 1:
            self._fill_gap(seq, out)
        self._apply(seq, frames[2], out)

    def _apply(self, seq: int, payload: bytes, out: list[VllmEvent]) -> None:
        self.last_seq = seq
        try:
            events = decode_batch(seq, payload)
        except SchemaError as err:
            self._problem("schema", f"{err}; skipped (the picture keeps what it had)", seq)
            return
        self.mirror.apply(events)
        out += events

    def _catch_up(self, out: list[VllmEvent]) -> None:
        """A peer (re)connected: what vLLM sent before, from its replay buffer, so a watch that
        joins late knows the cache at once rather than at vLLM's next message (which a PUB may
        also drop while the new subscription reaches it)."""
        if self._replay is None:
            return
        got, why = self._replay.fetch(self.last_seq + 1, None)
        for s, payload in got:
            if s > self.last_seq:
                self._apply(s, payload, out)
        if why:
            self._problem("gap", f"could not catch up with what {self.endpoint} sent before the "
                          f"watch joined: {why}", self.last_seq + 1)

    def _fill_gap(self, seq: int, out: list[VllmEvent]) -> None:
        first = self.last_seq + 1
        what = (f"messages {first}..{seq - 1}" if seq - 1 > first else f"message {first}")
        if self._replay is None:
            self._problem("gap", f"{what} of {self.endpoint} never arrived and there is no "
                          f"replay endpoint to ask: blocks they stored or removed are missing "
                          f"from the picture", seq)
            return
        got, why = self._replay.fetch(first, seq)
        for s, payload in got:
            if s > self.last_seq:
                self._apply(s, payload, out)
        if why:
            self._problem("gap", f"{what} of {self.endpoint} were missed and not all could be "
                          f"replayed ({len(got)} came back): {why}; blocks they stored or "
                          f"removed are missing from the picture", seq)

    # ---- the peer ------------------------------------------------------------------------------

    def _check_peer(self) -> None:
        peer = self._events.peer
        waited = time.monotonic() - self._started
        if peer == "not zmq":
            self._problem("not zmq", f"the peer at {self.endpoint} does not speak ZMQ: is it "
                          f"vLLM's HTTP port? KV events have their own endpoint, set by "
                          f"--kv-events-config")
        elif self._last_message is None and waited >= self.silence_s:
            if peer == "zmq":
                self._problem("silent", f"connected to {self.endpoint}, but no KV events came "
                              f"in {waited:.0f} s: vLLM publishes them only when started with "
                              f"--enable-prefix-caching and --kv-events-config "
                              f"'{{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", "
                              f"...}}', and only when its cache changes (send it a request)")
            elif self._events.bind:
                self._problem("no answer", f"no vLLM connected to {self.endpoint} in "
                              f"{waited:.0f} s: start vLLM with --kv-events-config "
                              f"'{{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", "
                              f"\"endpoint\": \"{self.endpoint}\"}}'")
            else:
                why = "connection refused" if peer == "refused" else "no answer"
                self._problem("no answer", f"nothing answered at {self.endpoint} in "
                              f"{waited:.0f} s ({why}): is vLLM running there, with KV events "
                              f"published at that endpoint?")

    def _problem(self, kind: str, message: str, seq: int | None = None) -> None:
        """Note a problem; a peer's problem (no answer, silent, not zmq) only once."""
        if kind in ("no answer", "silent", "not zmq"):
            if kind in self._said:
                return
            self._said.add(kind)
        self.problems.append(WatchProblem(kind, message, seq))
        self._problem_at = self.mirror.batches
