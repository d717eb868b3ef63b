"""A page's events are answered side by side (Gradio runs each event's handler in a thread of its
own), so an answer that began on a session can end after a Load, Reset or Apply put a new one in
its place. Such a late answer must change nothing: writing the old session back lost a loaded
workload (a loaded test run saw the Serving tab's answer come after Load's, and the page said
"operation 0 of 0"). Each test runs the app's own handlers on a dry build, in the order the
race gives them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import gradio as gr
import pytest

from engine import EngineConfig, ops
from tests.helpers import fingerprint
from ui.session import Session, UserError

DRY = "dry (bookkeeping only, no model)"
WORKLOAD = "beams and samples"


@pytest.fixture(scope="module")
def handlers() -> dict[str, Callable[..., Any]]:
    """The dry app's handlers by name; "load workload" is the Serving tab's Load (the page's own
    load event is also called on_load)."""
    from ui.app import build_app

    demo = build_app(DRY)
    fns = {f.name: f.fn for f in demo.fns.values()}
    (fns["load workload"],) = [f.fn for f in demo.fns.values()
                               if f.name == "on_load" and len(f.inputs) == 2]
    return fns


def dry_session() -> Session:
    return Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=32))


def is_skip(value: Any) -> bool:
    return isinstance(value, dict) and value == gr.skip()


def test_a_tab_answer_after_load_changes_nothing(handlers):
    old = dry_session()
    new = handlers["load workload"](WORKLOAD, old)[0]  # Load answered first ...
    assert isinstance(new, Session) and new is not old and len(new.ops) >= 2
    late = handlers["on_session_tab"](old, 1.0)  # ... then the Serving tab that began before it
    assert all(is_skip(v) for v in late), "a late tab answer would write the old session back"
    assert old.replaced and not new.replaced


def test_a_tab_answer_never_writes_the_session(handlers):
    s = dry_session()
    out = handlers["on_session_tab"](s, 1.0)
    assert is_skip(out[0]) and not all(is_skip(v) for v in out[1:]), "the tab drew nothing"


def test_an_action_after_load_is_refused_and_the_new_session_is_untouched(handlers):
    old = dry_session()
    new = handlers["load workload"](WORKLOAD, old)[0]
    before, log = fingerprint(new.engine), list(new.ops)
    for name, args in (("on_step", (old,)), ("on_new", ("abcdef", False, old)),
                       ("on_goto", (0, old)), ("on_apply", (DRY, 4, 16, True, old))):
        with pytest.raises(gr.Error, match="a new session began"):
            handlers[name](*args)
    assert fingerprint(new.engine) == before and new.ops == log
    new.engine.check_invariants()
    handlers["on_step"](new)  # the new one acts as before
    assert len(new.ops) == len(log) + 1


def test_an_answer_whose_session_was_replaced_while_it_ran_is_refused():
    from ui.page import guard

    def reset_lands_meanwhile(session):
        session.fresh()  # what a Reset answered in another thread does to this answer's session
        return (session, "drawn")

    def load(session):  # a handler that replaces its own session answers with the new one
        return (session.fresh(), "drawn")

    with pytest.raises(gr.Error, match="a new session began"):
        guard(reset_lands_meanwhile)(dry_session())
    new, _ = guard(load)(dry_session())
    assert not new.replaced


def test_a_replaced_session_refuses_operations_and_keeps_its_log():
    s = dry_session()
    s.run(ops.AddSequence("abcdef"))
    log = list(s.ops)
    s.fresh()
    with pytest.raises(UserError, match="a new session began"):
        s.run(ops.Append(0, n=1))
    assert s.ops == log


def test_load_waits_for_an_action_under_way_on_the_old_session():
    """The action ends on the old session first (its answer is written before Load's); then
    the old one is replaced."""
    s = dry_session()
    done = threading.Event()
    s.lock.acquire()  # an action under way
    try:
        t = threading.Thread(target=lambda: (s.fresh(), done.set()), daemon=True)
        t.start()
        t.join(0.3)
        assert not done.is_set() and not s.replaced, "Load replaced a session an action was using"
    finally:
        s.lock.release()
    t.join(30)
    assert done.is_set() and s.replaced
