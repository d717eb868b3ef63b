"""A tensor-parallel worker's steps: what one rank does with each message from the engine.

A **device step** (engine/tp/step_message.py) runs from the decode buffers: the rows and the
changed table entries the engine sent go into this rank's persistent tables
(`DecodeGraphs.load`), the tokens the engine does not have yet are read from this rank's last
picks, and the step replays its CUDA graph (all-reduces captured inside it) or, on a CPU, runs
the same function eagerly. Any other step runs the general path (`ModelRunner.execute`).

Rank 0 answers each step with every row's greedy pick and its log probability (16 bytes a row,
picked on the device: one transfer back) and keeps the logits for a request that samples. On a
GPU the transfer is queued behind the step (`PendingReply`): the worker writes the reply when it
lands, and meanwhile can already launch the next step if the engine sent it (async scheduling),
so the GPU does not wait for this rank's host between steps.
Every rank keeps its picks on the device when the engine schedules asynchronously: the next
step's message then names where a token is ("row r of your last picks") instead of sending it.
All ranks hold the same picks, as the all-reduce leaves every rank the same hidden state.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import numpy as np
import torch

from engine.runtime.decode_graphs import DecodeOutputs, DecodeStep
from engine.runtime.sampler import TorchScores
from engine.runtime.transfer import to_device
from engine.tp.step_message import DeviceStep


class StepRunner:
    """Runs the engine's steps on one rank's ModelRunner. `keep_picks`: keep each step's greedy
    picks on the device (async scheduling); `timing`: rank 0 times each device step's host work
    and graph (the bench asks for them)."""

    def __init__(self, runner: Any, rank: int, keep_picks: bool, timing: bool) -> None:
        self.runner, self.rank = runner, rank
        self.keep_picks = keep_picks
        self.picks: torch.Tensor | None = None  # the last step's greedy tokens, by engine row
        self.last: TorchScores | None = None  # rank 0: the last step's scores (logits asked)
        self.last_order: list[int] | None = None  # ... and where each engine row's logits lie
        self._rows: Any = None  # the last device step's rows of the persistent batch
        self.timing = timing and rank == 0
        self.times: list[tuple[float, float, float]] = []  # (host to launch, GPU, whole) ms
        self.eager_steps = 0  # general steps run (PAGEDLAB_TP_PROFILE_STEP counts them)
        self.device_steps = 0  # ... and device steps (PAGEDLAB_TP_PROFILE_DEVICE_STEP)
        self.host_profile: list[tuple[str, float, int]] | None = None  # (op, host µs, calls)
        self.eager_times: list[tuple[float, float, float]] = []  # ... of the general steps
        self.profile: list[tuple[str, float, int]] | None = None  # (kernel, GPU ms, calls)

    # ---- a device step --------------------------------------------------------------------------

    def device_step(self, msg: DeviceStep, received: float) -> bytes | PendingReply | None:
        """Run one device step; rank 0 returns its reply. `received`: when the message was
        read (perf_counter), for the timings. With timing on, the
        PAGEDLAB_TP_PROFILE_DEVICE_STEP-th one's host work is profiled by operation."""
        self.device_steps += 1
        if self.timing and self.device_steps == int(os.environ.get(
                "PAGEDLAB_TP_PROFILE_DEVICE_STEP", "0")):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                reply = self._device_step(msg, received)
            self.host_profile = host_times(prof)
            return reply
        return self._device_step(msg, received)

    def _device_step(self, msg: DeviceStep, received: float) -> bytes | PendingReply | None:
        g, n, q = self.runner.graphs, msg.n, msg.q
        rows = msg.rows if msg.rows is not None else self._rows
        self._rows = rows
        drafts = msg.drafts if msg.drafts is not None else np.zeros(n, dtype=np.int32)
        size = g.load(DecodeStep(msg.tokens, msg.positions, drafts, [], [], q), rows,
                      msg.index, msg.value)
        if msg.check is not None:  # tests: this rank's rows hold the engine's tables
            g.state.check(list(rows), msg.check)
        feed = self._feeder(msg.feed)
        timed = self.timing and g.use_graphs
        if timed:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        out = g.replay(size, n, q, feed)
        if timed:
            end.record()
        launched = time.perf_counter()
        order = None if q == 1 else _logit_rows(drafts, msg.num_logits, q)
        scores = TorchScores(out.logits, None, _greedy(out), workspace=self.runner.sampler_workspace,
                             rows=order, accepted=out.accepted)
        reply = self._picks(scores, out, order)
        if timed and isinstance(reply, PendingReply):
            def note() -> None:  # once the step's picks are on the host: its graph is done
                self.times.append((1e3 * (launched - received), start.elapsed_time(end),
                                   1e3 * (time.perf_counter() - received)))

            reply.on_done = note
        return reply

    def _feeder(self, feed: Any) -> Any:
        """A function writing the fed tokens into the step's input ids [B, q] (None: none)."""
        if not len(feed):
            return None
        if self.picks is None:
            raise RuntimeError("a step reads tokens from the last step's picks, but this worker "
                               "kept none (async scheduling off?)")
        picks, dev = self.picks, self.picks.device
        where = to_device(np.array(feed[0::2], dtype=np.int64), torch.long, dev)
        src = to_device(np.array(feed[1::2], dtype=np.int64), torch.long, dev)

        def write(ids: torch.Tensor) -> None:
            ids[:, 0].index_copy_(0, where, picks.index_select(0, src).to(ids.dtype))

        return write

    # ---- a general step -------------------------------------------------------------------------

    def general_step(self, items: list[Any], feed: list[tuple[int, int]] | None,
                     received: float | None = None) -> bytes | None:
        """A step the decode buffers do not take (prefills, mixed steps): run eagerly. With
        timing on, rank 0 times it (`received`: when its message was read) and profiles the
        PAGEDLAB_TP_PROFILE_STEP-th one (1-based) by kernel."""
        fed = None
        if feed:
            if self.picks is None:
                raise RuntimeError("a step reads tokens from the last step's picks, but this "
                                   "worker kept none")
            fed = (feed, self.picks)
        self.eager_steps += 1
        if not self.timing or self.runner.device.type != "cuda":
            return self._general(items, fed)
        profiled = self.eager_steps == int(os.environ.get("PAGEDLAB_TP_PROFILE_STEP", "0"))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began = time.perf_counter()
        with _profiler() if profiled else contextlib.nullcontext() as prof:
            start.record()
            reply = self._general(items, fed)  # its picks read on the host: the step is done
            end.record()
            end.synchronize()
        done = time.perf_counter()
        if prof is not None:
            self.profile = kernel_times(prof)
            if os.environ.get("PAGEDLAB_TP_PROFILE_TRACE"):  # the step's timeline, for a viewer
                prof.export_chrome_trace(os.environ["PAGEDLAB_TP_PROFILE_TRACE"])
        self.eager_times.append((1e3 * (began - (received or began)), start.elapsed_time(end),
                                 1e3 * (done - (received or began))))
        return reply

    def _general(self, items: list[Any], fed: Any) -> bytes | None:
        logits = self.runner.execute(items, fed)
        scores = TorchScores(logits, workspace=self.runner.sampler_workspace)
        return self._picks(scores, None, None)

    # ---- picks ----------------------------------------------------------------------------------

    def _picks(self, scores: TorchScores, out: DecodeOutputs | None, order: list[int] | None
               ) -> bytes | PendingReply | None:
        """Keep the picks (by engine row) where the next step may read them; rank 0 keeps the
        scores and returns (token, log prob) of every row as float64 pairs."""
        on_device = out is not None and out.greedy_ids is not None
        if on_device:  # the graph picked them: no host work, one transfer back on rank 0
            ids, lps = out.greedy_ids, out.greedy_logprobs
            if order is not None:
                at = to_device(order, torch.long, ids.device)
                ids, lps = ids.index_select(0, at), lps.index_select(0, at)
            if self.keep_picks:
                self.picks = ids
            if self.rank != 0:
                return None
            self.last, self.last_order = scores, order
            pairs = torch.stack([ids.double(), lps.double()], 1)
            host = torch.empty(pairs.shape, dtype=pairs.dtype, pin_memory=True)
            host.copy_(pairs, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            return PendingReply(host, done)
        if self.rank != 0 and not self.keep_picks:
            return None
        rows = len(order) if order is not None else scores.num_rows
        pairs = [scores.greedy(i) for i in range(rows)]
        if self.keep_picks:
            self.picks = torch.tensor([t for t, _ in pairs], dtype=torch.long,
                                      device=scores.logits.device)
        if self.rank != 0:
            return None
        self.last, self.last_order = scores, order
        return np.asarray(pairs, dtype=np.float64).tobytes()

    def logits(self) -> bytes:
        """The last step's logits, float32 [rows, vocab], by engine row (rank 0)."""
        if self.last is None:
            raise RuntimeError("no step has run on this worker yet")
        logits = self.last.logits
        if self.last_order is not None:
            logits = logits.index_select(0, torch.tensor(self.last_order, device=logits.device))
        return logits.to("cpu", torch.float32).contiguous().numpy().tobytes()

    def stats(self) -> dict[str, Any]:
        """Rank 0's timings of its device steps since the last ask (ms), then forgotten."""
        times, self.times = self.times, []
        eager, self.eager_times = self.eager_times, []
        profile, self.profile = self.profile, None
        host_profile, self.host_profile = self.host_profile, None
        return {"steps": len(times), "host_to_launch_ms": [t[0] for t in times],
                "graph_gpu_ms": [t[1] for t in times], "whole_ms": [t[2] for t in times],
                "eager": {"steps": len(eager), "host_to_launch_ms": [t[0] for t in eager],
                          "gpu_ms": [t[1] for t in eager], "whole_ms": [t[2] for t in eager]},
                "profile": profile, "device_step_host": host_profile}


class PendingReply:
    """Rank 0's reply to a step whose picks are on their way to the host (a copy queued behind
    the step, then an event): `ready()` polls, `payload()` waits for it and gives the bytes."""

    def __init__(self, host: torch.Tensor, done: Any) -> None:
        self.host, self.done = host, done
        self.on_done: Any = None

    def ready(self) -> bool:
        return self.done.query()

    def payload(self) -> bytes:
        self.done.synchronize()
        if self.on_done is not None:
            self.on_done()
        return self.host.numpy().tobytes()


def _greedy(out: DecodeOutputs) -> tuple[torch.Tensor, torch.Tensor] | None:
    return None if out.greedy_ids is None else (out.greedy_ids, out.greedy_logprobs)


def _logit_rows(drafts: Any, num_logits: Any, q: int) -> list[int]:
    """Where each engine row's logits lie among a padded step's n x q rows: item i computed
    drafts[i] + 1 tokens and wants the logits of its last num_logits[i] (ModelRunner.decode)."""
    return [i * q + j for i, (d, k) in enumerate(zip(drafts.tolist(), num_logits.tolist(),
                                                     strict=True))
            for j in range(d + 1 - k, d + 1)]


def _profiler() -> Any:
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    return torch.profiler.profile(activities=acts)


def host_times(prof: Any, top: int = 25) -> list[tuple[str, float, int]]:
    """A profiled step's host operations: (name, own host µs, calls), the longest first."""
    rows = [(e.key[:90], round(e.self_cpu_time_total, 1), int(e.count))
            for e in prof.key_averages() if e.self_cpu_time_total]
    return sorted(rows, key=lambda r: -r[1])[:top]


def kernel_times(prof: Any, top: int = 40) -> list[tuple[str, float, int]]:
    """A profiled step's GPU kernels: (name, GPU ms, calls), the longest first."""
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        us = us if us is not None else getattr(e, "self_cuda_time_total", 0.0)
        if us and e.device_type.name == "CUDA":
            rows.append((e.key[:90], round(us / 1e3, 3), int(e.count)))
    return sorted(rows, key=lambda r: -r[1])[:top]
