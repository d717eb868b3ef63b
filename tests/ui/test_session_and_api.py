"""The app's session logic and its served API: time travel, traces and links, clear errors that
change nothing, and sessions that do not see each other."""

from __future__ import annotations

import json

import pytest

from engine import EngineConfig, ops
from tests.helpers import fingerprint
from ui.session import MAX_TRACE_BYTES, Session, UserError
from ui.session_budget import BUDGET


def dry_session() -> Session:
    return Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=8))


def test_back_next_undo_and_timeline_move_over_the_op_log():
    s = dry_session()
    a = s.run(ops.AddSequence("abcdef"))
    s.run(ops.Fork(a))
    s.run(ops.Append(a, n=3))
    after = fingerprint(s.engine)
    s.goto(1)
    assert len(s.engine.snapshot().sequences) == 1
    s.goto(3)
    assert fingerprint(s.engine) == after  # forward again: the same state
    s.goto(2)
    s.run(ops.Free(a))  # an operation in the past drops the future
    assert [op["op"] for op in s.ops] == ["add_sequence", "fork", "free"]
    s.undo()
    assert len(s.ops) == 2 and len(s.engine.snapshot().sequences) == 2


def test_refused_operation_is_a_user_error_and_changes_nothing():
    s = dry_session()
    a = s.run(ops.AddSequence("abcdef"))
    before, log = fingerprint(s.engine), list(s.ops)
    for call in (lambda: s.run(ops.Append(a, n=100)), lambda: s.run(ops.Free(9)),
                 lambda: s.run(ops.AddSequence("   "))):
        with pytest.raises(ValueError):  # a UserError, or the op's own OpError for a blank prompt
            call()
        assert fingerprint(s.engine) == before and s.ops == log
    s.engine.check_invariants()


def test_export_import_and_link_reproduce_the_session():
    s = dry_session()
    a = s.run(ops.AddSequence("Four score"))
    s.run(ops.Append(s.run(ops.Fork(a)), n=2))
    raw = json.dumps(s.export()).encode()
    assert fingerprint(Session.from_bytes(raw).engine) == fingerprint(s.engine)
    assert fingerprint(Session.from_link(s.to_link()).engine) == fingerprint(s.engine)


@pytest.mark.parametrize(("raw", "message"), [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "not a PagedLab trace"),
    (json.dumps({"version": 1, "config": {"block_size": 0}, "ops": []}).encode(), "config is invalid"),
    (json.dumps({"version": 1, "config": {"model": "/etc/passwd"}, "ops": []}).encode(),
     "runs only 'default'"),
    (json.dumps({"version": 1, "config": {"model": None}, "ops": [{"op": "free", "seq": 4}]}).encode(),
     "does not replay"),
    (b" " * (MAX_TRACE_BYTES + 1), "the most accepted"),
])
def test_bad_traces_are_refused_with_a_message(raw, message):
    with pytest.raises(UserError, match=message):
        Session.from_bytes(raw)


def test_a_damaged_link_is_refused():
    with pytest.raises(UserError, match="damaged"):
        Session.from_link("not-base64-zlib!!")


def test_sessions_are_never_deep_copied_with_their_engine():
    import copy

    s = dry_session()
    s.run(ops.AddSequence("abc"))
    fresh = copy.deepcopy(s)
    assert fresh.ops == [] and not fresh.engine_ready and fresh not in BUDGET


def test_the_app_builds_without_launching():
    from ui.app import build_app

    demo = build_app("dry (bookkeeping only, no model)")
    assert demo is not None


@pytest.mark.slow
def test_api_new_append_fork_append_copies_on_write_and_sessions_are_separate(served_app):
    from gradio_client import Client

    a = Client(served_app, verbose=False)
    out = a.predict("Four score and seven years ago", False, api_name="/on_new")
    assert "model: SmolLM2-135M-Instruct" in out[-1] and "default" not in out[-1]
    a.predict("0", 2, api_name="/on_append")
    a.predict("0", api_name="/on_fork")
    out = a.predict("1", 1, api_name="/on_append")
    assert "`cow`" in out[1] and "copy-on-write" in out[1]
    b = Client(served_app, verbose=False)
    out_b = b.predict("Hello", False, api_name="/on_new")
    assert "operation 1 of 1" in out_b[-1]  # b does not see a's four operations
    assert out_b[5]["choices"] == [["0", "0"]]
    with pytest.raises(Exception, match="not in the list of choices"):
        a.predict("7", 1, api_name="/on_append")


def test_a_session_pickles_as_its_log_and_replays_to_the_same_state():
    """What a ZeroGPU worker receives and returns: config + op log, never an engine."""
    import pickle

    s = dry_session()
    a = s.run(ops.AddSequence("abcdef"))
    s.run(ops.Append(s.run(ops.Fork(a)), n=2))
    data = pickle.dumps(s)
    assert b"LLMEngine" not in data
    worker = pickle.loads(data)
    assert fingerprint(worker.engine) == fingerprint(s.engine)
    worker.run(ops.Free(a))
    back = pickle.loads(pickle.dumps(worker))
    assert back.ops == worker.ops and fingerprint(back.engine) == fingerprint(worker.engine)
    worker.selected_block, worker.presenter = 1, True  # what the page shows travels with it
    back = pickle.loads(pickle.dumps(worker))
    assert (back.selected_block, back.presenter, back.front) == (1, True, back)


def test_sessions_beyond_the_cap_get_a_clear_message_and_closing_frees_a_place(monkeypatch):
    from ui import session as session_module
    from ui.session_budget import SessionBudget

    # an account of this test's own: sessions earlier tests in this process left idle would be
    # let go to make room (as they should), and the second would find it
    monkeypatch.setattr(session_module, "BUDGET", SessionBudget(1 << 40, 1, idle_s=900, pressure_idle_s=120))
    monkeypatch.setattr(session_module, "MAX_SESSIONS", 1)
    first = dry_session()
    first.run(ops.AddSequence("abc"))
    second = dry_session()
    with pytest.raises(UserError, match="serving .* sessions"):
        second.run(ops.AddSequence("abc"))
    first.close()
    second.run(ops.AddSequence("abc"))  # the closed session's place is free again
    second.close()
