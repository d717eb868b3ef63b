"""Every input the UI and its API accept, bad on purpose: one row per input, with the message the
user sees. Each row runs through the app's own handlers on a dry session (in process: the code a
click runs); after each, the engine's invariants hold, the session is unchanged and a follow-up
operation works. A few rows also go through the served API, and the lesson rows through the
lesson loader and runner (lessons are repo files, but a teacher writes them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pytest

from engine import EngineConfig, ops
from tests.helpers import fingerprint
from ui import limits
from ui.session import MAX_OPS, MAX_TRACE_BYTES, Session, UserError

DRY = "dry (bookkeeping only, no model)"
REAL = "SmolLM2-135M (real model)"


@pytest.fixture(scope="module")
def handlers() -> dict[str, Callable[..., Any]]:
    """The app's click handlers by name (on_new, on_append, ...), from a dry build."""
    from ui.app import build_app

    demo = build_app(DRY)
    return {f.name: f.fn for f in demo.fns.values() if f.name.startswith("on_")}


def setup_session() -> Session:
    """seq 0 live ("abcdef"), seq 1 forked then freed; a 32-block pool of 4-token blocks."""
    s = Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=32))
    s.run(ops.AddSequence("abcdef"))
    s.run(ops.Fork(0))
    s.run(ops.Free(1))
    return s


def trace(config: dict | None = None, ops: list | None = None, **top: Any) -> bytes:
    doc = {"version": 1, "config": {"model": None, "block_size": 4, "num_gpu_blocks": 32,
                                    **(config or {})},
           "ops": ops if ops is not None else [{"op": "add_sequence", "prompt": "abc"}], **top}
    return json.dumps(doc).encode()


@dataclass(frozen=True)
class Row:
    id: str
    handler: str
    args: tuple  # the handler's inputs before the session
    message: str  # a substring of what the user sees


NAN, INF = float("nan"), float("inf")
TOKENS = "tokens must be a whole number from 1 to"
SEQ = "the sequence id must be a whole number"
POOL = "pool size (blocks) must be a whole number from 1 to"
BSZ = "block size must be a whole number from 1 to 128"

ROWS = [
    # ---- prompts (New sequence; Add request) ----
    Row("prompt-empty", "on_new", ("", False), "the prompt is empty"),
    Row("prompt-whitespace", "on_new", (" \n\t ", False), "the prompt is empty"),
    Row("prompt-100k-chars", "on_new", ("x" * 100_000, False),
        "prompt is 100,000 characters; the most is 4,000"),
    Row("prompt-over-token-limit", "on_new", ("y" * limits.MAX_PROMPT_CHARS, False),
        f"tokens; the most is {limits.MAX_PROMPT_TOKENS:,}"),
    Row("prompt-longer-than-pool", "on_new", ("z" * 200, False), "more than the 128 this engine can hold"),
    Row("prompt-lone-surrogate", "on_new", ("ab\ud800c", False), "lone surrogate (U+D800) at character 2"),
    Row("prompt-nul", "on_new", ("ab\x00c", False), "control character U+0000"),
    Row("prompt-escape-seq", "on_new", ("\x1b[31mred", False), "control character U+001B"),
    Row("prompt-del", "on_new", ("a\x7f", False), "control character U+007F"),
    Row("prompt-not-text", "on_new", (None, False), "the prompt must be text"),
    Row("prompt-number", "on_new", (42, False), "the prompt must be text"),
    Row("request-prompt-empty", "on_add_request", ("", 1, 1, 4, 0.0), "the prompt is empty"),
    Row("request-prompt-100k", "on_add_request", ("x" * 100_000, 1, 1, 4, 0.0),
        "request prompt is 100,000 characters; the most is 4,000"),
    Row("request-prompt-surrogate", "on_add_request", ("\udfff", 1, 1, 4, 0.0), "lone surrogate"),
    Row("request-prompt-control", "on_add_request", ("a\x07b", 1, 1, 4, 0.0), "U+0007"),
    # ---- numbers: tokens to append ----
    Row("append-0", "on_append", ("0", 0), TOKENS),
    Row("append-negative", "on_append", ("0", -3), TOKENS),
    Row("append-huge", "on_append", ("0", 10**12), TOKENS),
    Row("append-nan", "on_append", ("0", NAN), TOKENS),
    Row("append-inf", "on_append", ("0", INF), TOKENS),
    Row("append-fraction", "on_append", ("0", 2.5), TOKENS),
    Row("append-text", "on_append", ("0", "many"), TOKENS),
    Row("append-none", "on_append", ("0", None), TOKENS),
    Row("append-bool", "on_append", ("0", True), TOKENS),
    Row("append-past-pool", "on_append", ("0", 200), "free block(s) but the pool has only"),
    # ---- numbers: request parameters ----
    Row("request-n-0", "on_add_request", ("hi", 0, 1, 4, 0.0), "n samples must be a whole number from 1"),
    Row("request-n-fraction", "on_add_request", ("hi", 2.5, 1, 4, 0.0),
        "n samples must be a whole number from 1"),
    Row("request-n-huge", "on_add_request", ("hi", 10**6, 1, 4, 0.0), "n samples must be"),
    Row("request-beam-negative", "on_add_request", ("hi", 1, -1, 4, 0.0), "beam width must be"),
    Row("request-beam-nan", "on_add_request", ("hi", 1, NAN, 4, 0.0), "beam width must be"),
    Row("request-max-0", "on_add_request", ("hi", 1, 1, 0, 0.0), "max tokens must be a whole number"),
    Row("request-max-fraction", "on_add_request", ("hi", 1, 1, 2.5, 0.0),
        "max tokens must be a whole number"),
    Row("request-max-huge", "on_add_request", ("hi", 1, 1, 10**9, 0.0), "max tokens must be"),
    Row("request-max-text", "on_add_request", ("hi", 1, 1, "lots", 0.0), "max tokens must be"),
    Row("request-max-past-pool", "on_add_request", ("hi", 1, 1, 300, 0.0), "exceeds the 128 tokens"),
    Row("request-temp-nan", "on_add_request", ("hi", 1, 1, 4, NAN), "temperature must be a number"),
    Row("request-temp-negative", "on_add_request", ("hi", 1, 1, 4, -1), "temperature must be a number"),
    Row("request-temp-huge", "on_add_request", ("hi", 1, 1, 4, 1e300), "temperature must be a number"),
    Row("request-temp-text", "on_add_request", ("hi", 1, 1, 4, "warm"), "temperature must be a number"),
    Row("request-n-and-beam", "on_add_request", ("hi", 2, 2, 4, 0.0), "either n > 1"),
    # ---- numbers: engine settings (Apply) ----
    Row("apply-block-size-0", "on_apply", (DRY, 0, 32, True), BSZ),
    Row("apply-block-size-3", "on_apply", (DRY, 3, 32, True), "block size 3 is not offered"),
    Row("apply-block-size-huge", "on_apply", (DRY, 10**9, 32, True), BSZ),
    Row("apply-block-size-nan", "on_apply", (DRY, NAN, 32, True), BSZ),
    Row("apply-pool-0", "on_apply", (DRY, 4, 0, True), POOL),
    Row("apply-pool-negative", "on_apply", (DRY, 4, -8, True), POOL),
    Row("apply-pool-huge", "on_apply", (DRY, 4, 10**9, True), POOL),
    Row("apply-pool-nan", "on_apply", (DRY, 4, NAN, True), POOL),
    Row("apply-pool-text", "on_apply", (DRY, 4, "big", True), POOL),
    Row("apply-real-pool-too-big", "on_apply", (REAL, 16, 1000, True), f"{POOL} 256"),
    Row("apply-model-path", "on_apply", ("/etc/passwd", 4, 32, True), "engine must be one of"),
    Row("apply-model-hf-id", "on_apply", ("gpt2", 4, 32, True), "engine must be one of"),
    # ---- numbers: timeline, block inspector ----
    Row("goto-negative", "on_goto", (-1,), "the timeline position must be a whole number"),
    Row("goto-nan", "on_goto", (NAN,), "the timeline position must be"),
    Row("goto-text", "on_goto", ("end",), "the timeline position must be"),
    Row("inspect-dry", "on_inspect", (0, 0), "the dry mode has no K/V tensors"),
    Row("inspect-negative-block", "on_inspect", (-1, 0), "block id must be a whole number from 0 to 31"),
    Row("inspect-nan-layer", "on_inspect", (0, NAN), "layer must be a whole number"),
    # ---- ids ----
    Row("id-unknown", "on_append", ("99", 1), "unknown sequence id 99 (live sequences: 0)"),
    Row("id-freed-append", "on_append", ("1", 1), "seq 1 was freed at step 3"),
    Row("id-freed-free", "on_free", ("1",), "seq 1 was freed"),
    Row("id-freed-fork", "on_fork", ("1",), "seq 1 was freed"),
    Row("id-another-sessions", "on_fork", ("7",), "unknown sequence id 7"),
    Row("id-negative", "on_fork", ("-1",), SEQ),
    Row("id-text", "on_free", ("zero",), SEQ),
    Row("id-fraction", "on_append", ("0.5", 1), SEQ),
    Row("id-none", "on_free", (None,), "choose a sequence first"),
    Row("id-empty", "on_fork", ("",), "choose a sequence first"),
    Row("step-without-request", "on_step", (), "no request is waiting or running"),
    # ---- traces (import) ----
    Row("trace-malformed-json", "on_import", (b"{not json",), "not valid JSON"),
    Row("trace-invalid-utf8", "on_import", (b'{"version": 1\xff\xfe}',), "not valid JSON"),
    Row("trace-empty-file", "on_import", (b"",), "not valid JSON"),
    Row("trace-a-list", "on_import", (b"[1, 2]",), "not a PagedLab trace"),
    Row("trace-wrong-version", "on_import", (trace(version=2),), "not a PagedLab trace"),
    Row("trace-no-config", "on_import", (b'{"version": 1, "ops": []}',), "not a PagedLab trace"),
    Row("trace-config-not-object", "on_import", (b'{"version": 1, "config": 3, "ops": []}',),
        "config is invalid"),
    Row("trace-config-unknown-field", "on_import", (trace({"eval": "1"}),), "unknown engine config field"),
    Row("trace-config-bad-type", "on_import", (trace({"block_size": "4"}),), "config is invalid"),
    Row("trace-model-path", "on_import", (trace({"model": "/etc/passwd"}),), "runs only 'default'"),
    Row("trace-model-hub-id", "on_import", (trace({"model": "gpt2"}),), "runs only 'default'"),
    Row("trace-block-size-3", "on_import", (trace({"block_size": 3}),), "block size 3 is not offered"),
    Row("trace-pool-huge", "on_import", (trace({"num_gpu_blocks": 10**6}),), "a dry pool holds at most"),
    Row("trace-real-pool-huge", "on_import", (trace({"model": "default", "block_size": 16,
                                                     "num_gpu_blocks": 10**5}),),
        "a real-model pool holds at most"),
    Row("trace-ops-not-list", "on_import", (trace(ops={"op": "free"}),), "ops must be a list"),
    Row("trace-too-many-ops", "on_import", (trace(ops=[{"op": "step"}] * (MAX_OPS + 1)),),
        f"at most {MAX_OPS} operations"),
    Row("trace-unknown-op", "on_import", (trace(ops=[{"op": "eval", "code": "1"}]),), "unknown operation"),
    Row("trace-op-not-object", "on_import", (trace(ops=["free"]),), "unknown operation"),
    Row("trace-bad-id", "on_import", (trace(ops=[{"op": "free", "seq": 4}]),), "does not replay"),
    Row("trace-huge-append", "on_import", (trace(ops=[{"op": "add_sequence", "prompt": "ab"},
                                                      {"op": "append", "seq": 0, "n": 10**4}]),),
        "exceeds a limit: append adds at most"),
    Row("trace-append-past-op-limit", "on_import", (trace(ops=[{"op": "add_sequence", "prompt": "ab"},
                                                               {"op": "append", "seq": 0, "n": 10**6}]),),
        "n must be a whole number from 1 to 100000"),
    Row("trace-huge-prompt", "on_import", (trace(ops=[{"op": "add_sequence", "prompt": "x" * 10**5}]),),
        "exceeds a limit: prompt is 100,000 characters; the most is 4,000"),
    Row("trace-surrogate-prompt", "on_import", (trace(ops=[{"op": "add_sequence", "prompt": "\ud800"}]),),
        "lone surrogate"),
    Row("trace-too-many-requests", "on_import",
        (trace(ops=[{"op": "add_request", "prompt": "a", "params": {"max_tokens": 1}}]
               * (limits.MAX_REQUESTS + 1)),), "requests, the most it may"),
    Row("trace-from-real-model-tokens", "on_import",
        (trace(ops=[{"op": "add_sequence", "prompt": [40000, 2]}]),), "outside the vocabulary"),
    Row("trace-pool-too-small-for-ops", "on_import",
        (trace({"num_gpu_blocks": 2}, [{"op": "add_sequence", "prompt": "abcdefghijk"}]),),
        "does not replay"),
    Row("trace-huge-file", "on_import", (b" " * (MAX_TRACE_BYTES + 1),), "the most accepted"),
    Row("trace-not-bytes", "on_import", ("/etc/passwd",), "upload a trace file"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_row(row: Row, handlers: dict[str, Callable[..., Any]]) -> None:
    s = setup_session()
    before, ops = fingerprint(s.engine), list(s.ops)
    with pytest.raises(gr.Error) as err:
        handlers[row.handler](*row.args, s)
    assert row.message in str(err.value.message), err.value.message
    assert "Traceback" not in str(err.value.message)
    # the session is exactly as it was, its invariants hold, and it still works
    assert s.ops == ops and fingerprint(s.engine) == before
    s.engine.check_invariants()
    out = handlers["on_append"]("0", 1, s)
    assert out[0] is s and "operation 4 of 4" in out[-1]
    s.engine.check_invariants()


def test_the_matrix_covers_every_handler_that_takes_input(handlers) -> None:
    covered = {r.handler for r in ROWS}
    takes_input = {"on_new", "on_append", "on_fork", "on_free", "on_add_request", "on_step",
                   "on_apply", "on_goto", "on_inspect", "on_import"}
    assert takes_input <= covered <= set(handlers)


def test_markup_in_a_prompt_is_shown_as_text(handlers) -> None:
    s = setup_session()
    out = handlers["on_new"]("<script>alert(1)</script>", False, s)
    assert "<script>" not in out[3] and "&lt;" in out[3]  # the sequences panel escapes it
    s.engine.check_invariants()


def test_a_trace_from_another_block_size_runs_with_its_own_config(handlers) -> None:
    out = handlers["on_import"](trace({"block_size": 16, "num_gpu_blocks": 8}), setup_session())
    assert out[0].config.block_size == 16 and "operation 1 of 1" in out[-1]
    out[0].engine.check_invariants()


@pytest.mark.parametrize(("token", "message"), [
    ("!!!not-a-link", "damaged"),
    ("A" * (MAX_TRACE_BYTES + 1), "too long"),
    ("eJzLSM3JyQcABiwCFQ", "not valid JSON"),  # zlib of b"hello"
])
def test_bad_links_are_refused(token: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        Session.from_link(token)


def test_limits_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLAB_MAX_PROMPT_CHARS", "ten")
    with pytest.raises(ValueError, match="PAGEDLAB_MAX_PROMPT_CHARS='ten' must be a whole number"):
        limits._env_int("PAGEDLAB_MAX_PROMPT_CHARS", 4000)
    monkeypatch.setenv("PAGEDLAB_MAX_PROMPT_CHARS", "12")
    assert limits._env_int("PAGEDLAB_MAX_PROMPT_CHARS", 4000) == 12
    monkeypatch.setattr(limits, "MAX_PROMPT_CHARS", 12)
    with pytest.raises(UserError, match="prompt is 13 characters; the most is 12"):
        setup_session().run(ops.AddSequence("x" * 13))


def test_ops_and_request_limits(monkeypatch) -> None:
    from engine import SamplingParams
    from ui import session as session_module

    s = setup_session()
    monkeypatch.setattr(session_module, "MAX_OPS", 4)
    s.run(ops.Append(0, n=1))
    with pytest.raises(UserError, match="this session has 4 operations"):
        s.run(ops.Append(0, n=1))
    monkeypatch.setattr(session_module, "MAX_OPS", 2000)
    monkeypatch.setattr(limits, "MAX_REQUESTS", 1)
    s.run(ops.AddRequest("ab", SamplingParams(max_tokens=2)))
    with pytest.raises(UserError, match="added 1 requests, the most it may"):
        s.run(ops.AddRequest("ab", SamplingParams(max_tokens=2)))
    s.engine.check_invariants()


# ---- lessons: a teacher's broken file gets file, line and what is wrong --------------------------

LESSON_FRONT = ("---\ntitle: T\nsummary: S\nengine: {model: dry, block_size: 4, num_gpu_blocks: 8}\n"
                "dry_reason: a test\n---\n")
LESSON_STEP = "## Step: one\n\n```ops\na = add_sequence \"abcdef\"\n```\n"


@pytest.mark.parametrize(("text", "message"), [
    ("## Step: x\n", "a lesson starts with front matter"),
    ("---\ntitle: T\n## Step: x\n", "the front matter is not closed"),
    ("---\ntitle: [unclosed\n---\n## Step: x\n", "front matter is not valid YAML"),
    ("---\n- a\n- b\n---\n## Step: x\n", "must be 'key: value' lines"),
    ("---\ntitle: T\nsummary: S\nevil: 1\n---\n## Step: x\n", "unknown front matter key"),
    (LESSON_FRONT + "## Step: x\n\n```check\n__import__('os')\n```\n", "not allowed"),
    (LESSON_FRONT + "## Step: x\n\n```check\nopen('/etc/passwd')\n```\n", "unknown name(s) open"),
])
def test_broken_lesson_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    from lessons import LessonError, load

    p = tmp_path / "broken.md"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(LessonError, match="broken.md:") as err:
        load(p)
    assert message in str(err.value)


@pytest.mark.parametrize(("check", "message"), [
    ("len(table(a)) == 5", "check failed: len(table(a)) == 5"),
    ("table(a)[99] == 0", "failed to evaluate"),
    ("1 / 0 == 1", "failed to evaluate"),
])
def test_bad_lesson_checks_fail_with_file_and_line_and_the_run_stays_usable(tmp_path, check, message):
    from lessons import LessonCheckFailed, LessonRun, load

    p = tmp_path / "broken.md"
    p.write_text(LESSON_FRONT + LESSON_STEP + f"\n```check\n{check}\n```\n", encoding="utf-8")
    run = LessonRun(load(p), device="cpu")
    with pytest.raises(LessonCheckFailed) as err:
        run.next()
    assert "broken.md:" in str(err.value) and message in str(err.value)
    assert run.index == 0
    run.engine.check_invariants()
    run.restart()  # still usable


# ---- a few rows through the served API (gradio_client, the real default model) ----------------

@pytest.mark.slow
def test_bad_inputs_through_the_served_api(served_app) -> None:
    from gradio_client import Client

    c = Client(served_app, verbose=False)
    c.predict("Hello", False, api_name="/on_new")
    for args, api, message in [
        (("", False), "/on_new", "the prompt is empty"),
        (("x" * 100_000, False), "/on_new", "prompt is 100,000 characters; the most is 4,000"),
        (("a\x00b", False), "/on_new", "control character U+0000"),
        (("0", -5), "/on_append", "tokens must be a whole number from 1"),
        (("0", 2.5), "/on_append", "tokens must be a whole number"),
        (("hi", 1, 1, 10**9, 0.0), "/on_add_request", "max tokens must be a whole number from 1 to 512"),
        ((DRY, 3, 32, True), "/on_apply", "Value: 3 is not in the list of choices"),
        (("/etc/passwd", 4, 32, True), "/on_apply", "not in the list of choices"),
        ((DRY, 4, 10**6, True), "/on_apply", "pool size (blocks) must be a whole number from 1 to 4096"),
    ]:
        with pytest.raises(Exception) as err:
            c.predict(*args, api_name=api)
        assert message in str(err.value), (api, str(err.value)[:300])
    out = c.predict("0", 1, api_name="/on_append")  # the session still works
    assert "operation 2 of 2" in out[-1], out[-1]
