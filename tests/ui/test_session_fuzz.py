"""Random click sequences through a Session (dry mode, small pools): new, append, fork, free,
add request, step, back, next, undo, timeline, export/import. Every refusal must be a UserError
that changes nothing; after every click the engine's invariants hold and the state equals the
replay of the op log; at the end the session is still usable. A few seconds in all."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import EngineConfig, LLMEngine, SamplingParams, ops
from engine.ops import OpError
from tests.helpers import fingerprint
from ui.session import Session, UserError

KINDS = ["new", "append", "fork", "free", "add_request", "step", "back", "next", "undo", "goto",
         "export_import"]

clicks = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 9), st.integers(1, 6)),
                  min_size=1, max_size=40)
configs = st.builds(
    lambda bs, nb, prefix, swap, budget: EngineConfig(
        model=None, block_size=bs, num_gpu_blocks=nb, num_cpu_blocks=nb if swap else 0,
        enable_prefix_caching=prefix, preemption_mode="swap" if swap else "recompute",
        # small budgets chunk the longer prompts (chunked prefill), 2048 never does
        max_num_batched_tokens=budget),
    st.sampled_from([1, 2, 4]), st.integers(2, 8), st.booleans(), st.booleans(),
    st.sampled_from([3, 7, 2048]))
PROMPTS = ["ab", "abcd", "abcdefgh", "the same prefix", "the same prefix again", "x"]


def click(s: Session, kind: str, a: int, b: int) -> None:
    live = list(s.engine.seqs)
    seq = live[a % len(live)] if live and a < 8 else a  # mostly live ids, sometimes a stale one
    if kind == "new":
        s.run(ops.AddSequence(PROMPTS[a % len(PROMPTS)]))
    elif kind == "append":
        s.run(ops.Append(seq, n=b))
    elif kind == "fork":
        s.run(ops.Fork(seq))
    elif kind == "free":
        s.run(ops.Free(seq))
    elif kind == "add_request":
        beam = 2 if a % 3 == 0 else 1
        s.run(ops.AddRequest(PROMPTS[a % len(PROMPTS)],
              SamplingParams(max_tokens=b, n=1 if beam > 1 else 1 + a % 2, beam_width=beam)))
    elif kind == "step":
        s.run(ops.Step())
    elif kind == "back":
        s.goto(s.pos - 1)
    elif kind == "next":
        s.goto(s.pos + 1)
    elif kind == "undo":
        s.undo()
    elif kind == "goto":
        s.goto(a * len(s.ops) // 9)
    elif kind == "export_import":
        copy = Session.from_bytes(json.dumps(s.export()).encode())
        assert fingerprint(copy.engine) == fingerprint(s.engine)


def replayed(s: Session) -> Any:
    return fingerprint(LLMEngine.replay(s.config, s.ops[: s.pos]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, script=clicks)
def test_random_clicks_keep_the_session_consistent_and_usable(config: EngineConfig, script) -> None:
    s = Session(config)
    try:
        for kind, a, b in script:
            before, log, pos = fingerprint(s.engine), list(s.ops), s.pos
            try:
                click(s, kind, a, b)
            except (UserError, OpError):  # OpError: an argument the operation itself refuses
                assert (s.ops, s.pos) == (log, pos) and fingerprint(s.engine) == before
            s.engine.check_invariants()
            assert fingerprint(s.engine) == replayed(s)  # the log is the truth
        # still usable: free the playground's sequences, finish the requests (which may have
        # waited for those blocks), then a new sequence fits in the empty pool
        s.goto(len(s.ops))
        for sid, seq in list(s.engine.seqs.items()):
            if seq.request_id is None:
                s.run(ops.Free(sid))
        for _ in range(500):
            if not s.engine.has_pending_work():
                break
            s.run(ops.Step())
        assert not s.engine.seqs
        s.engine.check_invariants()
        assert s.engine.snapshot().metrics.used_blocks == 0
        s.run(ops.AddSequence("ok"))
        s.engine.check_invariants()
    finally:
        s.close()
