"""The op log is the source of truth: replay, export / import, seeded dry appends."""

import json

import pytest

from engine import EngineConfig, LLMEngine
from engine.describe.narration import logged, narrate
from tests.helpers import fingerprint

CFG = EngineConfig(model=None, block_size=4, num_gpu_blocks=12, seed=7)


def session() -> LLMEngine:
    eng = LLMEngine(CFG)
    a = eng.add_sequence("The quick brown fox")
    b = eng.fork(a)
    eng.append(a, n=5)
    eng.append(b, token_ids=[65, 66])
    eng.free(a)
    eng.add_sequence("The quick brown cat")
    return eng


def test_replay_rebuilds_an_identical_state():
    eng = session()
    assert [op["op"] for op in eng.trace] == [
        "add_sequence", "fork", "append", "append", "free", "add_sequence"
    ]
    assert fingerprint(LLMEngine.replay(CFG, eng.trace)) == fingerprint(eng)


def test_export_survives_json_and_imports_to_the_same_state():
    eng = session()
    data = json.loads(json.dumps(eng.export_trace()))
    assert fingerprint(LLMEngine.from_trace(data)) == fingerprint(eng)


def test_dry_appends_are_seeded_by_the_config():
    def drawn(seed: int) -> tuple[int, ...]:
        eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=12, seed=seed))
        s = eng.add_sequence("The quick brown fox")
        eng.append(s, n=20)
        return eng.snapshot().sequences[s].token_ids

    assert drawn(7) == drawn(7)
    assert drawn(7) != drawn(8)


def test_undo_is_a_replay_of_all_but_the_last_operation():
    eng = session()
    undone = LLMEngine.replay(CFG, eng.trace[:-1])
    assert len(undone.snapshot().sequences) == 1
    undone.check_invariants()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "not a PagedLab trace"),
        ({"version": 99, "config": {}, "ops": []}, "not a PagedLab trace"),
        ({"version": 1, "config": {"block_size": 4, "warp": 9}, "ops": []}, "unknown engine config"),
        ({"version": 1, "config": {"model": None, "block_size": 4}, "ops": {}}, "list of operations"),
        ({"version": 1, "config": {"model": None}, "ops": [{"op": "explode"}]}, "unknown operation"),
        ({"version": 1, "config": {"model": None}, "ops": [{"op": "free", "seq": 3}]},
         "trace operation 0 .* failed on replay: unknown sequence id 3"),
    ],
)
def test_malformed_trace_is_refused_with_a_clear_message(data, message):
    with pytest.raises(ValueError, match=message):
        LLMEngine.from_trace(data)


def test_events_carry_step_seq_and_a_narration():
    eng = LLMEngine(CFG)
    s = eng.add_sequence([1, 2, 3, 4, 5])
    c = eng.fork(s)
    events = eng.append(c, token_ids=[9])
    assert {e.step for e in events} == {3}
    cow = next(e for e in events if e.kind == "cow")
    assert cow.seq_id == c
    assert "copy-on-write: block 1 copied to block 2" in narrate(cow)
    assert logged(cow).startswith("[step 3] ")
