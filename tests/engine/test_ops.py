"""engine/ops.py: every operation round-trips through its op-log record, records written before
the module existed load unchanged, each argument limit is refused with a message that says what
to fix, and prefix caching on / off is an operation the op log records and a replay repeats."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams, ops
from engine.ops import MAX_APPEND_PER_CALL, OpError

DRY = EngineConfig(model=None, block_size=4, num_gpu_blocks=32)

EVERY_OP = [
    ops.AddSequence("Four score"),
    ops.AddSequence([1, 2, 3]),
    ops.Append(0, n=3),
    ops.Append(0),
    ops.Append(0, token_ids=[65, 66]),
    ops.Fork(0),
    ops.Free(1),
    ops.AddRequest("hello", SamplingParams(max_tokens=4, n=2, stop=("x",))),
    ops.AddRequest([5, 6]),
    ops.Step(),
    ops.SetPrefixCaching(False),
]


@pytest.mark.parametrize("op", EVERY_OP, ids=lambda op: f"{op.name}")
def test_every_op_round_trips_through_its_record(op: ops.Op) -> None:
    record = op.to_record()
    assert record["op"] == op.name
    assert ops.parse(record) == op
    assert ops.parse(record).to_record() == record


# records as engine.trace wrote them before engine/ops.py (and as exported traces and links hold them)
OLD_TRACE = [
    {"op": "add_sequence", "prompt": "abcdef"},
    {"op": "add_sequence", "prompt": [97, 98, 99, 100, 101]},
    {"op": "append", "seq": 0, "n": 3},
    {"op": "append", "seq": 1, "token_ids": [120, 121]},
    {"op": "fork", "seq": 0},
    {"op": "free", "seq": 1},
    {"op": "add_request", "prompt": "req", "params": {"max_tokens": 2, "temperature": 0.0, "top_p": 1.0,
                                                      "top_k": 0, "n": 1, "beam_width": 1,
                                                      "length_penalty": 1.0, "seed": None, "stop": [],
                                                      "ignore_eos": False}},
    {"op": "step"},
    {"op": "step"},
]


def test_an_old_trace_loads_unchanged() -> None:
    eng = LLMEngine.replay(DRY, OLD_TRACE)
    assert eng.trace == [dict(r, params=dict(r["params"], stop=())) if "params" in r else r
                         for r in OLD_TRACE]
    eng.check_invariants()
    again = LLMEngine.from_trace(eng.export_trace())
    assert again.snapshot() == eng.snapshot() and again.trace == eng.trace


def test_the_public_primitives_record_what_they_did() -> None:
    eng = LLMEngine(DRY)
    a = eng.add_sequence("abcdef")
    eng.append(a, n=2)
    eng.append(a, token_ids=(120,))
    eng.free(eng.fork(a))
    assert eng.trace == [{"op": "add_sequence", "prompt": "abcdef"},
                         {"op": "append", "seq": 0, "n": 2},
                         {"op": "append", "seq": 0, "token_ids": [120]},
                         {"op": "fork", "seq": 0}, {"op": "free", "seq": 1}]
    assert [ops.parse(r) for r in eng.trace][1] == ops.Append(0, n=2)


@pytest.mark.parametrize("make, words", [
    (lambda: ops.Append(0, n=0), f"n must be a whole number from 1 to {MAX_APPEND_PER_CALL}, got 0"),
    (lambda: ops.Append(0, n=MAX_APPEND_PER_CALL + 1), "n must be a whole number from 1 to"),
    (lambda: ops.Append(0, n=2.5), "n must be a whole number"),
    (lambda: ops.Append(0, n=True), "n must be a whole number"),
    (lambda: ops.Append(0, n=2, token_ids=[1]), "give either n or token_ids to append, not both"),
    (lambda: ops.Append(0, token_ids=[]), "token_ids is empty"),
    (lambda: ops.Append(0, token_ids="ab"), "token_ids must be a list of token ids, got str"),
    (lambda: ops.Append(0, token_ids=[1, "a"]), "token_ids: a token id must be an int, got 'a'"),
    (lambda: ops.Append("0", n=1), "a sequence id is a whole number, got '0'"),
    (lambda: ops.Fork(None), "a sequence id is a whole number, got None"),
    (lambda: ops.Free(False), "a sequence id is a whole number, got False"),
    (lambda: ops.AddSequence("  \n"), "the prompt is empty: type some text"),
    (lambda: ops.AddSequence([]), "the prompt is empty: give at least one token"),
    (lambda: ops.AddSequence(42), "prompt must be a list of token ids, got int"),
    (lambda: ops.AddRequest("hi", {"max_tokens": 2}), "params must be a SamplingParams, got dict"),
    (lambda: ops.SetPrefixCaching("yes"), "enabled must be True or False, got 'yes'"),
    (lambda: ops.parse({"op": "eval", "code": "1"}), "unknown operation"),
    (lambda: ops.parse(["free"]), "unknown operation"),
    (lambda: ops.parse({"op": "append", "seq": 0}), "n must be a whole number from 1 to"),
    (lambda: ops.parse({"op": "add_request", "prompt": "a", "params": 3}), "params must be an object"),
    (lambda: ops.parse({"op": "add_request", "prompt": "a", "params": {"bogus": 1}}), "params:"),
])
def test_each_limit_is_refused_with_a_clear_message(make, words: str) -> None:
    with pytest.raises(ValueError) as err:
        make()
    assert words in str(err.value)


def test_a_refused_op_changes_nothing_and_the_engine_names_what_it_checks() -> None:
    eng = LLMEngine(DRY)
    a = eng.add_sequence("abcdef")
    before = (eng.snapshot(), eng.trace)
    for bad, words in ((ops.Append(7, n=1), "unknown sequence id 7"),
                       (ops.Append(a, token_ids=[999]), "outside the vocabulary"),
                       (ops.AddSequence([1, 10**6]), "outside the vocabulary")):
        with pytest.raises(ValueError, match=words):
            eng.apply(bad)
    with pytest.raises(OpError):  # a malformed record is refused by the vocabulary, before the engine
        eng.apply({"op": "fork", "seq": "a"})
    assert (eng.snapshot(), eng.trace) == before


def test_apply_takes_an_op_or_its_record() -> None:
    eng = LLMEngine(DRY)
    assert eng.apply(ops.AddSequence("abcdef")) == 0
    assert eng.apply({"op": "fork", "seq": 0}) == 1
    assert eng.trace[-1] == {"op": "fork", "seq": 0}


def test_set_prefix_caching_is_recorded_and_replayed() -> None:
    eng = LLMEngine(DRY)
    eng.free(eng.add_sequence("abcdefgh"))  # two full blocks, cached
    eng.apply(ops.SetPrefixCaching(False))
    eng.add_sequence("abcdefghij")  # no prefix hit while caching is off
    assert eng.snapshot().metrics.prefix_hit_blocks == 0
    eng.apply(ops.SetPrefixCaching(True))
    eng.add_sequence("abcdefghij")
    hits = eng.snapshot().metrics.prefix_hit_blocks
    assert hits == 2
    assert {"op": "set_prefix_caching", "enabled": False} in eng.trace
    again = LLMEngine.replay(DRY, eng.trace)
    assert again.snapshot() == eng.snapshot() and again.trace == eng.trace
    again.check_invariants()
