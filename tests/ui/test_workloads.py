"""Serving's workloads on the real default model do what their names say, and each greedy
request answers what it answers alone (float32): the shared-prefix workload once ended in one
step, every request answering the end-of-text token to its raw text."""

from __future__ import annotations

import dataclasses

import pytest

from engine import EngineConfig, LLMEngine, ops
from engine.describe.memory_use import MemoryPoint
from ui import workloads
from ui.run_views import session_series
from ui.session import Session

pytestmark = pytest.mark.slow
CONFIG = EngineConfig(model="default", dtype="float32", block_size=16)


def _run(name: str) -> tuple[Session, list[MemoryPoint]]:
    """The workload run to the end; its outputs each checked against the request alone."""
    s = workloads.load(name, Session(CONFIG))
    while s.engine.has_pending_work():
        s.run(ops.Step())
    s.engine.check_invariants()
    outs = sorted(s.engine.finished_requests(), key=lambda o: o.request_id)
    requests = workloads.WORKLOADS[name].requests
    assert len(outs) == len(requests)
    alone = LLMEngine(dataclasses.replace(CONFIG, enable_prefix_caching=False))  # one at a time
    for out, (_, params) in zip(outs, requests, strict=True):
        by_itself = alone.generate([list(out.prompt_token_ids)], params)[0]
        assert out.outputs[0].token_ids == by_itself.outputs[0].token_ids, (name, out.request_id)
    return s, session_series(s)


def test_a_shared_prefix_hits_and_every_request_answers(default_model) -> None:
    s, series = _run("a shared prefix (one system prompt)")
    assert sum(p.prefix_hits for p in series) >= 3  # the system prompt's blocks, for each later request
    assert max(p.shared for p in series) >= 1  # the trunk held by several requests at once
    assert all(len(o.outputs[0].token_ids) >= 4 for o in s.engine.finished_requests())


def test_the_preemption_workload_preempts_by_swap_and_answers_as_alone(default_model,
                                                                       monkeypatch) -> None:
    # stories of 20 tokens, not 40: the workload sizes its pool from what a request needs, so it
    # preempts as at 40 (twice: once by swap, once by recompute) in half the steps and alone runs
    name = "preemption (a pool too small)"
    work = workloads.WORKLOADS[name]
    monkeypatch.setitem(workloads.WORKLOADS, name, work._replace(requests=tuple(
        (text, dataclasses.replace(params, max_tokens=20)) for text, params in work.requests)))
    s, series = _run(name)
    assert sum(p.preemptions for p in series) >= 2
    assert any(p.swapped for p in series)
    # its stories are instructions: in the chat template the model tells them (issue 42, item
    # 2: on the bare text every output began with the end of its turn, "<|im_end|>")
    for out in s.engine.finished_requests():
        text = out.outputs[0].text
        assert not text.lstrip().startswith("<|im_end|>") and len(text.split()) >= 10, text
