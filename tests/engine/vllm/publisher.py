"""A ZMQ publisher in the test process that speaks vLLM's KV event protocol
(vllm/distributed/kv_events.py ZmqEventPublisher): PUB frames (topic, 8-byte sequence number,
msgpack payload), a ROUTER that replays buffered messages from a sequence number on and ends
with sequence number -1. It can also drop messages (a gap), send malformed frames and forget old
messages, which a real vLLM does not do on demand."""

from __future__ import annotations

import threading
import time
from collections import deque

import zmq

from engine.vllm.schema import AllBlocksCleared, BlockRemoved, BlockStored, encode_batch

END = (-1).to_bytes(8, "big", signed=True)


class Publisher:
    def __init__(self, buffer: int = 10_000, replay: bool = True) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self.seq = 0
        self.replay_endpoint = None
        self._stop = threading.Event()
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            port = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"tcp://127.0.0.1:{port}"
            self.lock = threading.Lock()
            self.thread = threading.Thread(target=self._serve, daemon=True)
            self.thread.start()

    def publish(self, *events: BlockStored | BlockRemoved | AllBlocksCleared,
                drop: bool = False) -> int:
        """One message (a batch); `drop`: buffered for replay but never sent (a lost message)."""
        seq, self.seq = self.seq, self.seq + 1
        payload = encode_batch(time.time(), list(events))
        self.buffer.append((seq, payload))
        if not drop:
            self.pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        return seq

    def send_raw(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            client, _, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    self.router.send_multipart([client, b"", b"", seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([client, b"", b"", END, b""])

    def close(self) -> None:
        self._stop.set()
        if self.replay_endpoint:
            self.thread.join(2)
            self.router.close(0)
        self.pub.close(0)
        self.ctx.term()


def stored(hashes: list[int | bytes], parent: int | bytes | None, block_size: int = 2,
           first_token: int = 0, medium: str | None = "GPU") -> BlockStored:
    """A BlockStored of len(hashes) blocks of `block_size` made-up tokens."""
    tokens = list(range(first_token, first_token + block_size * len(hashes)))
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                       block_size=block_size, medium=medium)


def removed(hashes: list[int | bytes], medium: str | None = "GPU") -> BlockRemoved:
    return BlockRemoved(block_hashes=hashes, medium=medium)
