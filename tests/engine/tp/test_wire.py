"""The wire of tensor parallelism without worker processes: the shared-memory ring, the step
message, and the engine's half of the persistent batch against a worker's half.

The engine sends a decode step as the diff of its persistent batch (engine/tp/device_batch.py);
a worker scatters it into its own rows (DecodeGraphs.load). Here both halves run in one process
on sequences that grow, fork, finish and are replaced, and the worker's rows are compared with
the tables every step; and the message of a decode step is measured: its size follows the batch
and what changed, never the width of the block tables.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
import torch

from engine.runtime.decode_graphs import DecodeGraphs, DecodeStep
from engine.runtime.protocols import StepItem
from engine.tp.device_batch import DeviceBatch, GraphSpec
from engine.tp.shm_ring import ShmRing, Waiter
from engine.tp.step_message import DeviceStep, decode, encode_device_step, encode_object

BS = 4


def test_ring_carries_messages_longer_than_its_slots_to_every_reader(tmp_path):
    path = str(tmp_path / "ring")
    ShmRing.create(path, readers=2, slots=3, slot_bytes=64)
    rng = random.Random(0)
    messages = [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))) for _ in range(60)]
    got: list[list[bytes]] = [[], []]

    def read(r: int) -> None:
        ring = ShmRing(path, r)
        for _ in messages:
            got[r].append(ring.read(Waiter()))
        ring.close()

    readers = [threading.Thread(target=read, args=(r,)) for r in range(2)]
    for t in readers:
        t.start()
    writer = ShmRing(path)
    for m in messages:  # 3 slots of 64 bytes: the writer waits for both readers again and again
        writer.write(m, Waiter(check=_deadline(10)))
    for t in readers:
        t.join(10)
    assert got == [messages, messages]
    writer.close()


def test_a_full_ring_nobody_reads_is_an_error_not_a_hang(tmp_path):
    path = str(tmp_path / "ring")
    ShmRing.create(path, readers=1, slots=2, slot_bytes=64)
    writer = ShmRing(path)
    writer.write(b"one", Waiter())
    writer.write(b"two", Waiter())
    with pytest.raises(TimeoutError):
        writer.write(b"three", Waiter(check=_deadline(0.2), check_every_s=0.01))
    reader = ShmRing(path, 0)
    assert reader.ready() and reader.read(Waiter()) == b"one"
    assert reader.read(Waiter()) == b"two" and not reader.ready()


def test_step_message_round_trip():
    step = DeviceStep(q=3, tokens=[5, 6, 0, 7, 0, 0], positions=[10, 3], drafts=[1, 0],
                      num_logits=[2, 1], rows=[4, 0], index=[17, 30], value=[9, 2],
                      feed=[1, 5], cache_ops=[("swap_in", [(3, 4)]), ("copy_blocks", [(1, 2), (5, 6)])],
                      check=[[[1, 2], [3]]])
    back = decode(encode_device_step(step))
    for name in ("tokens", "positions", "drafts", "num_logits", "rows", "index", "value", "feed"):
        assert list(getattr(back, name)) == list(getattr(step, name)), name
    assert back.q == 3 and back.cache_ops == step.cache_ops and back.check == step.check
    plain = decode(encode_device_step(DeviceStep(1, [8], [2], None, None, None, [], [])))
    assert plain.drafts is None and plain.rows is None and plain.check is None and not plain.cache_ops
    assert decode(encode_object({"cmd": "stop"})) == {"cmd": "stop"}


def _spec(width: int, groups: int = 1) -> GraphSpec:
    return GraphSpec(use_graphs=False, pad=False, static_queries=False, sizes=(1, 2, 4, 8),
                     max_batch=8, max_query=1, width=width, block_size=BS,
                     windows=(None,) * groups, max_model_len=4096, num_blocks=1000)


class _WorkerRows:
    """A worker's decode buffers on the CPU (nothing is computed: only their rows are read) and
    the rows of its last device step."""

    def __init__(self, spec: GraphSpec) -> None:
        self.graphs = DecodeGraphs(lambda *a: None, torch.device("cpu"), spec.max_batch,
                                   spec.width, spec.max_model_len, use_graphs=False,
                                   num_groups=len(spec.windows), block_size=BS)
        self.rows = None

    def step(self, raw: bytes, tables: list[list[int]]) -> None:
        """What a worker does with the message, then its rows compared with every table."""
        msg = decode(raw)
        self.rows = msg.rows if msg.rows is not None else self.rows
        zeros = np.zeros(msg.n, dtype=np.int32)
        self.graphs.load(DecodeStep(msg.tokens, msg.positions, zeros, [], [], 1), self.rows,
                         msg.index, msg.value)
        self.graphs.state.check(list(self.rows), [tables])


def _send(batch: DeviceBatch, worker: _WorkerRows, items: list[StepItem]) -> int:
    """One device step from the engine's half to the worker's, through the bytes. Returns the
    message's size."""
    plan = batch.plan(items)
    assert plan is not None
    raw = encode_device_step(plan)
    worker.step(raw, [list(it.block_table) for it in items])
    return len(raw)


def _decode_run(width: int, prompt: int, steps: int, seed: int = 0) -> list[int]:
    """Four sequences decoding: one forks, one finishes and another takes its row, a last block
    is copied on write; returns the message bytes of every step."""
    rng = random.Random(seed)
    batch, worker = DeviceBatch(_spec(width)), _WorkerRows(_spec(width))
    free = list(range(999, 0, -1))
    tables = {k: [free.pop() for _ in range(-(-prompt // BS))] for k in range(4)}
    lengths = dict.fromkeys(tables, prompt)
    sizes, next_key = [], 4
    for step in range(steps):
        for k in tables:  # a token each: a new block where the last one is full
            if lengths[k] % BS == 0:
                tables[k].append(free.pop())
            lengths[k] += 1
        if step == 5:  # a fork: the child shares the table, then copies the last block on write
            tables[next_key], lengths[next_key] = tables[0][:-1] + [free.pop()], lengths[0]
            next_key += 1
        if step == 9:  # one finishes, a new one takes its row
            del tables[1], lengths[1]
            tables[next_key] = [free.pop() for _ in range(-(-prompt // BS))]
            lengths[next_key] = prompt
            next_key += 1
        items = [StepItem([rng.randrange(100)], lengths[k] - 1, tables[k], 1, (), k) for k in tables]
        sizes.append(_send(batch, worker, items))
    return sizes


def test_worker_rows_follow_the_engine_tables_through_diffs():
    _decode_run(width=64, prompt=9, steps=30)  # every step checked inside


def test_decode_message_does_not_grow_with_table_width():
    """The same decodes over tables 3 and 120 blocks wide: every step's message has the same
    bytes but where a new row gets its whole table; a step where
    no table changed is the header and 8 bytes a sequence."""
    short = _decode_run(width=8, prompt=9, steps=20)
    long = _decode_run(width=160, prompt=473, steps=20)  # the same block boundaries (mod 4)
    whole = {0, 5, 9}  # the first step, the fork and the newcomer send their whole tables
    assert [s for i, s in enumerate(short) if i not in whole] == \
        [s for i, s in enumerate(long) if i not in whole]
    assert all(long[i] > short[i] for i in whole)
    n = [4] * 5 + [5] * 15  # the fork joins at step 5
    steady = [i for i, s in enumerate(short) if s == 20 + 8 * n[i]]
    assert len(steady) >= 10  # three steps in four change no table at block size 4
    assert max(short[1:9] + short[10:]) <= 20 + 8 * 5 + 8 * 5 + 4 * 5  # + a block each, rows


def _deadline(seconds: float):
    import time

    end = time.monotonic() + seconds

    def check() -> None:
        if time.monotonic() > end:
            raise TimeoutError("nobody read the ring")

    return check


class _LandsLater:
    """A stand-in CUDA event: done after `polls` queries (or when waited for)."""

    def __init__(self, polls: int) -> None:
        self.polls = polls

    def query(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    def synchronize(self) -> None:
        self.polls = -1


def test_worker_replies_in_order_while_picks_land(tmp_path):
    """Rank 0 on a GPU queues a step's picks to the host and moves on: its reply is written
    once they land, or before the next reply, and never after a later one."""
    from engine.tp.worker import _Worker
    from engine.tp.worker_steps import PendingReply

    ctl, back = str(tmp_path / "ctl"), str(tmp_path / "back")
    ShmRing.create(ctl, 1, 4, 64)
    ShmRing.create(back, 1, 4, 64)
    worker = object.__new__(_Worker)  # only its reply logic: no model
    worker.ctl, worker.reply, worker.wait, worker._pending = ShmRing(ctl, 0), ShmRing(back), \
        Waiter(check=_deadline(5)), None
    engine_out, engine_in = ShmRing(ctl), ShmRing(back, 0)

    def pending(value: float, polls: int) -> PendingReply:
        return PendingReply(torch.tensor([value], dtype=torch.float64), _LandsLater(polls))

    worker._answer(pending(1.0, polls=3))
    assert not engine_in.ready()  # still landing
    engine_out.write(b"next", Waiter())
    assert worker._next_message() == b"next"  # the message came first: step 2 runs first
    worker._answer(pending(2.0, polls=100))  # ... and step 1's reply is written before it
    worker._answer(b"logits")  # a command's answer waits for step 2's
    got = [engine_in.read(Waiter()) for _ in range(3)]
    assert got[:2] == [np.float64(1.0).tobytes(), np.float64(2.0).tobytes()]
    assert got[2] == b"logits"
    worker._answer(pending(3.0, polls=2))  # lands while the worker waits for a message:
    got_message: list[bytes] = []
    waiting = threading.Thread(target=lambda: got_message.append(worker._next_message()))
    waiting.start()
    assert engine_in.read(Waiter(check=_deadline(5))) == np.float64(3.0).tobytes()  # written
    engine_out.write(b"later", Waiter())
    waiting.join(5)
    assert got_message == [b"later"]
