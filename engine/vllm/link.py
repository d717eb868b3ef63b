"""The watch's sockets: a ZMQ SUB on vLLM's KV event endpoint, what its monitor says about the
peer, and a DEALER on vLLM's replay endpoint (a ROUTER) that asks for missed messages.

The SUB connects to an endpoint vLLM binds (`--kv-events-config '{"endpoint": "tcp://*:5557"}'`,
the usual way on a GPU box) or binds one vLLM connects to (an endpoint without `*` makes vLLM's
publisher connect: how a local vLLM publishes on the loopback interface only). The socket
monitor tells refused connections, a peer that does not speak ZMQ (an HTTP port given by
mistake) and a peer that does, so the watch can say which it is.

Replay (vLLM's ZmqEventPublisher._service_replay): send the first wanted sequence number as 8
bytes big-endian; vLLM answers every buffered message from there as (topic, seq, payload), then
an end marker whose sequence number is -1. A DEALER (not vLLM's example's REQ) takes the many
answers to one request.
"""

from __future__ import annotations

import re
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

END_SEQ = -1
#: a peer that took the connection and did not answer ZMQ's greeting in this long does not speak it
GREETING_S = 3.0
_ENDPOINT = re.compile(r"^(tcp://(\*|\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})|ipc://.+)$")


def check_endpoint(name: str, endpoint: object) -> str:
    """`endpoint` if it is a ZMQ tcp://HOST:PORT or ipc:// address, else a ValueError."""
    if not isinstance(endpoint, str) or not _ENDPOINT.match(endpoint):
        raise ValueError(f"{name} must look like tcp://HOST:PORT (vLLM's --kv-events-config "
                         f"endpoint), got {endpoint!r}")
    port = endpoint.rsplit(":", 1)[-1]
    if endpoint.startswith("tcp://") and not 0 < int(port) < 65536:
        raise ValueError(f"{name}: port {port} is not between 1 and 65535 ({endpoint})")
    return endpoint


class EventSocket:
    """The SUB socket and its monitor: messages in, and what is known of the peer."""

    def __init__(self, ctx: zmq.Context, endpoint: str, bind: bool) -> None:
        self.endpoint, self.bind = endpoint, bind
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, 1_000_000)  # as vLLM's publisher's own high-water mark
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: vLLM's default topic is ""
        self.monitor = self.sub.get_monitor_socket()
        self.peer = "none yet"  # none yet | refused | connected | not zmq | zmq | gone
        self._connected_at = 0.0
        try:
            (self.sub.bind if bind else self.sub.connect)(endpoint)
        except zmq.ZMQError as err:
            self.close()
            raise ValueError(f"could not {'bind' if bind else 'connect to'} {endpoint}: {err}"
                             ) from None

    def read_monitor(self) -> None:
        """Take in what the monitor reported since the last call."""
        while True:
            try:
                ev = recv_monitor_message(self.monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                break
            if ev in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED) and self.peer != "zmq":
                self.peer, self._connected_at = "connected", time.monotonic()
            elif ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.peer = "zmq"
            elif ev in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
                self.peer = "not zmq"
            elif ev == zmq.EVENT_DISCONNECTED:  # before a handshake: it hung up on ZMQ's greeting
                self.peer = {"connected": "not zmq", "zmq": "gone"}.get(self.peer, self.peer)
            elif ev == zmq.EVENT_CONNECT_RETRIED and self.peer == "none yet":
                self.peer = "refused"
        if self.peer == "connected" and time.monotonic() - self._connected_at > GREETING_S:
            self.peer = "not zmq"  # it took the connection but never answered ZMQ's greeting

    def close(self) -> None:
        try:
            self.sub.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(linger=0)
        self.sub.close(linger=0)


class ReplayClient:
    """Asks vLLM's replay endpoint for the messages from a sequence number on."""

    def __init__(self, ctx: zmq.Context, endpoint: str, timeout_s: float) -> None:
        self.ctx, self.endpoint, self.timeout_s = ctx, endpoint, timeout_s
        self.sock: zmq.Socket | None = None

    def _socket(self) -> zmq.Socket:
        if self.sock is None:
            self.sock = self.ctx.socket(zmq.DEALER)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.connect(self.endpoint)
        return self.sock

    def fetch(self, first: int, upto: int | None) -> tuple[list[tuple[int, bytes]], str | None]:
        """The messages first..upto - 1 (upto None: all from `first` on) vLLM still buffers, in
        order, and why any are missing (None: all came). Bounded by the timeout; a replay that
        timed out drops its socket, so late answers never mix with the next request's."""
        upto_ = upto if upto is not None else 1 << 62
        sock = self._socket()
        sock.send_multipart([b"", first.to_bytes(8, "big")])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000)):
                self.close()
                why = f"the replay endpoint {self.endpoint} did not answer in {self.timeout_s:g} s"
                return got, why
            frames = sock.recv_multipart()
            if len(frames) != 4:  # b"", topic, seq, payload
                continue
            seq = int.from_bytes(frames[2], "big", signed=True)
            if seq == END_SEQ or not frames[3]:
                break
            if first <= seq < upto_:
                got.append((seq, frames[3]))
            if seq >= upto_ - 1:
                self._drain_to_end(deadline)
                break
        missing = 0 if upto is None else (upto - first) - len(got)
        why = None if not missing else (
            f"vLLM's replay buffer no longer holds {missing} of them (it keeps the last "
            f"buffer_steps messages)")
        return got, why

    def _drain_to_end(self, deadline: float) -> None:
        """Read the rest of this replay (up to its end marker), so the next starts clean."""
        sock = self._socket()
        while time.monotonic() < deadline and sock.poll(int(max(0.0, deadline - time.monotonic()) * 1000)):
            frames = sock.recv_multipart()
            if len(frames) == 4 and (int.from_bytes(frames[2], "big", signed=True) == END_SEQ
                                     or not frames[3]):
                return
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
