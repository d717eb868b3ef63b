"""Lessons: every lesson plays from first to last step on the engine it names, every check holds,
every answer is computed, no placeholder is left, each page's text agrees with its picture;
broken lessons fail with file and line; the safe evaluator refuses what it must; Back/Restart
give the same state as replaying."""

from __future__ import annotations

from pathlib import Path

import pytest

from lessons import LessonCheckFailed, LessonError, LessonRun, load, load_all
from lessons.loader import lesson_files
from lessons.safe_eval import Evaluator, UnsafeExpression
from tests.lessons.page_claims import page_problems

LESSONS = lesson_files()
# lessons that play in a second or two; the others run the real model for many steps (slow)
QUICK_LESSONS = {"02_paging", "07_fragmentation", "08_block_size"}
LESSON_PARAMS = [pytest.param(p, id=p.stem, marks=() if p.stem in QUICK_LESSONS else pytest.mark.slow)
                 for p in LESSONS]


def _run(lesson, **kw) -> LessonRun:
    return LessonRun(lesson, device="cpu", dtype="float32", **kw)


def test_there_are_fifteen_lessons_sorted() -> None:
    lessons = load_all()
    assert len(lessons) == 15
    assert [lsn.path for lsn in lessons] == sorted(lsn.path for lsn in lessons)
    for lsn in lessons:
        assert lsn.title and lsn.summary and lsn.steps
        assert lsn.dry == (lsn.config.model is None)
        if lsn.dry:
            assert lsn.dry_reason


@pytest.mark.parametrize("path", LESSON_PARAMS)
def test_lesson_plays_to_the_end(path: Path, default_model) -> None:
    """Every page, the opening first: no placeholder left, every check and answer computed, a
    key sentence the class can read, and what the text says of the picture the picture shows
    (tests/lessons/page_claims.py), on the engine the lesson names with its default inputs."""
    lesson = load(path)
    run = _run(lesson)
    found: list[str] = []
    try:
        assert "{{" not in run.intro_markdown()
        found += page_problems(run)
        for i, step in enumerate(lesson.steps):
            q = run.question_for_next()
            assert (q is None) == (step.question is None)
            if q is not None:
                assert "{{" not in q.text and q.text.strip()
            view = run.next()
            assert view.index == i and view.total == len(lesson.steps)
            assert "{{" not in view.narration_markdown and "}}" not in view.narration_markdown
            assert view.narration_markdown.strip()
            assert len(view.checks) == len(step.checks)
            if step.question is not None:
                assert view.answer is not None and view.answer_text
                assert view.explanation is None or "{{" not in view.explanation
            assert_readable_page(view)
            found += page_problems(run)
        assert run.done and run.question_for_next() is None
    finally:
        run.close()
    assert not found, "\n".join(found)


KEY_WORDS = 40  # a key sentence a class reads in one breath, 24 px on a projector


def assert_readable_page(view) -> None:
    """What the class reads: the page's own key sentence (quoted by its writer), short; no raw
    Python values anywhere on the page."""
    import re

    from lessons.page_text import page_markdown, split_key

    assert any(p.lstrip().startswith(">") for p in view.narration_markdown.split("\n\n")), \
        f"page {view.index + 1} ({view.title}) quotes no key sentence"
    key, _ = split_key(view.narration_markdown)
    assert 0 < len(key.split()) <= KEY_WORDS, key
    shown = re.sub(r"`[^`]*`", "", page_markdown(view))  # code may say False
    assert not re.search(r"\bTrue\b|\bFalse\b|\[\d+(, \d+)*\]|\w\(s\)", shown), shown


def _write(tmp_path: Path, body: str, front: str | None = None) -> Path:
    front = front if front is not None else ("---\ntitle: T\nsummary: S\nengine: {model: dry, block_size: 4, "
                                             "num_gpu_blocks: 8}\ndry_reason: a test\n---\n")
    p = tmp_path / "broken.md"
    p.write_text(front + body, encoding="utf-8")
    return p


def test_broken_check_is_reported_with_file_and_line(tmp_path: Path) -> None:
    p = _write(tmp_path, "## Step: one\n\nHi.\n\n```ops\na = add_sequence \"abcdef\"\n```\n\n"
                         "```check\nlen(table(a)) == 2\nlen(table(a)) == 5\n```\n")
    run = _run(load(p))
    with pytest.raises(LessonCheckFailed) as e:
        run.next()
    assert f"{p}:17:" in str(e.value) and "len(table(a)) = 2" in str(e.value)
    assert run.index == 0  # a failed step is not counted as run


@pytest.mark.parametrize("body, line, words", [
    ("## Step: x\n\nA {{ 1 + }} b\n", 9, "syntax error"),
    ("## Step: x\n\n```ops\nfrobnicate a\n```\n", 10, "unknown operation"),
    ("## Step: x\n\n```ops\nappend a n=1\n```\n", 10, "unknown name"),
    ("## Step: x\n\n```check\n__import__('os')\n```\n", 10, "not allowed"),
    ("## Step: x\n\n```question\nWhat?\n```\n", 9, "answer"),
    ("## Step: x\n\nA {{ (lambda: 1)() }}\n", 9, "lambda"),
    ("## Step: x\n\n```ops\nappend\n```\n", 10, "takes seq"),
    ("## Step: x\n\nunclosed {{ 1\n", 9, "unbalanced"),
    ("No steps at all.\n", 7, "no steps"),
])
def test_malformed_lesson_names_file_and_line(tmp_path: Path, body: str, line: int, words: str) -> None:
    p = _write(tmp_path, body)
    with pytest.raises(LessonError) as e:
        load(p)
    assert str(e.value).startswith(f"{p}:{line}:"), str(e.value)
    assert words in str(e.value)


def test_bad_front_matter(tmp_path: Path) -> None:
    with pytest.raises(LessonError, match="dry_reason"):
        load(_write(tmp_path, "## Step: x\n", "---\ntitle: T\nsummary: S\nengine: {model: dry}\n---\n"))
    with pytest.raises(LessonError, match=":1: .*front matter"):
        load(_write(tmp_path, "## Step: x\n", ""))
    with pytest.raises(LessonError, match="block_size"):
        load(_write(tmp_path, "## Step: x\n", "---\ntitle: T\nsummary: S\nengine: {model: dry, "
                                              "block_size: 0, num_gpu_blocks: 4}\ndry_reason: r\n---\n"))


def test_runtime_error_in_op_names_line(tmp_path: Path) -> None:
    long_prompt = "abcdefghijklmnopqrstuvwxyz0123456789"  # 36 bytes > the pool's 32 slots
    p = _write(tmp_path, f"## Step: x\n\n```ops\na = add_sequence \"{long_prompt}\"\n```\n")
    with pytest.raises(LessonError, match=r"broken.md:10: .*failed"):
        _run(load(p)).next()


@pytest.mark.parametrize("expr", [
    "__import__('os')", "open('x')", "(1).__class__", "x.__class__", "len.__self__", "(lambda: 1)()",
    "[].append(1)", "x.bit_length()", "f'{x}'", "(y := 1)", "getattr(x, 'real')", "eval('1')",
    "exec('1')", "2 ** 10 ** 10", "'a' * 10 ** 9", "_private",
])
def test_safe_evaluator_refuses(expr: str) -> None:
    ev = Evaluator({"x": 3}, {"len": len})
    with pytest.raises(UnsafeExpression):
        ev.eval(expr)


def test_safe_evaluator_computes() -> None:
    ev = Evaluator({"xs": [1, 2, 3], "d": {"a b": 4}}, {"len": len, "sum": sum})
    assert ev.eval("sum(x * 2 for x in xs if x > 1)") == 10
    assert ev.eval("len(xs) == 3 and d['a b'] == 4 and xs[-1] in xs[1:]") is True
    assert ev.eval("1 < 2 < 3") and not ev.eval("1 < 3 < 2")
    assert ev.eval("'big' if len(xs) > 2 else 'small'") == "big"


def _state(run: LessonRun) -> tuple:
    snap = run.engine.snapshot()
    return snap.blocks, dict(snap.sequences), snap.metrics, run.engine.trace


@pytest.mark.slow
# lesson 3 on the real model: Back's recorded view, a replay, a rerun and Restart agree (lesson 6's
# preemption plays three times over here for the same check: tests/engine/test_checkpoint.py and
# tests/history hold swapped and recomputed state to a replay, bytes included)
@pytest.mark.parametrize("name", ["03_fork_cow"])
def test_back_and_restart_equal_replay(name: str, default_model) -> None:
    lesson = load(Path("lessons") / f"{name}.md")
    run = _run(lesson)
    views = [run.next() for _ in range(len(lesson.steps))]
    back = run.back()  # the recorded view: what a replay to that step gives
    assert back is not None and back.index == len(lesson.steps) - 2
    assert back.narration_markdown == views[-2].narration_markdown
    fresh = _run(lesson)
    for _ in range(len(lesson.steps) - 1):
        fresh.next()
    assert (back.snapshot, back.events) == (fresh.current.snapshot, fresh.current.events)
    assert run.next().narration_markdown == views[-1].narration_markdown
    view = run.goto(1, rerun=True)  # run again on a replayed engine: the same
    assert view.narration_markdown == views[1].narration_markdown
    assert _state(run)[:2] == (view.snapshot.blocks, dict(view.snapshot.sequences))
    run.restart()
    assert run.index == 0 and run.engine.snapshot().metrics.used_blocks == 0
    assert run.next().narration_markdown == views[0].narration_markdown


def test_back_from_first_step_returns_to_intro() -> None:
    lesson = load(Path("lessons") / "07_fragmentation.md")
    run = _run(lesson)
    run.next()
    assert run.back() is None and run.index == 0


@pytest.mark.slow
def test_params_choose_the_big_model(default_model) -> None:
    lesson = load(Path("lessons") / "01_kv_cache.md")
    texts = {}
    for choice in ("LLaMA-7B", "LLaMA-13B"):
        run = _run(lesson, params={"big_model": choice})
        texts[choice] = [run.next() for _ in range(3)][-1].narration_markdown
    assert "512.0 KiB" in texts["LLaMA-7B"] and "800.0 KiB" in texts["LLaMA-13B"]
    with pytest.raises(ValueError):
        _run(lesson, params={"big_model": "GPT-9"})


def test_block_size_lesson_cites_the_paper_figures_right() -> None:
    """vLLM's Fig. 18a is the attention kernel's latency, 18b the end-to-end latency by block size
    (issue 23): the trade-off step says so, not that 18b measures the kernel."""
    lesson = load(Path("lessons") / "08_block_size.md")
    run = _run(lesson)
    views = [run.next() for _ in range(len(lesson.steps))]
    step = next(v for s, v in zip(lesson.steps, views, strict=True) if s.title == "The trade-off")
    text = " ".join(step.narration_markdown.split())
    assert "Fig. 18a measures the attention kernel's latency" in text
    assert "Fig. 18b the end-to-end latency for each block size" in text
    assert "18b measures the kernel" not in text


def test_lessons_pluralise_counts_with_the_helper() -> None:
    """A computed count is written with plural() ('1 KV head', '2 requests'), never 'request(s)'
    (issue 23); the helper is the narration's own."""
    import re

    from engine.describe.narration import plural as narration_plural
    from lessons.helpers import PURE_HELPERS

    assert PURE_HELPERS["plural"] is narration_plural
    for path in LESSONS:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\w\(s\)", text), f"{path.name}: write the count with plural()"


def test_titles_fit_the_lesson_list(tmp_path: Path) -> None:
    """Every title shows whole in the dropdown beside Start; a longer one is refused by name."""
    from lessons.front_matter import MAX_TITLE

    assert all(len(lesson.title) <= MAX_TITLE for lesson in load_all())
    with pytest.raises(LessonError, match="shorten it"):
        load(_write(tmp_path, "## Step: x\n", "---\ntitle: " + "T" * (MAX_TITLE + 1) +
                    "\nsummary: S\nengine: {model: null, block_size: 4, num_gpu_blocks: 4}\n"
                    "dry_reason: r\n---\n"))


def test_values_are_written_for_people() -> None:
    """yes / no, "1 and 3", never Python's True / [1, 3] (issue 23)."""
    from lessons.context import show

    assert (show(True), show(False), show(None)) == ("yes", "no", "none")
    assert (show([1, 3]), show((0, 1, 2)), show([]), show([7])) == ("1 and 3", "0, 1 and 2", "none", "7")
    assert show(0.123456) == "0.1235"


def test_the_picture_names_a_lessons_sequences_as_its_text_does() -> None:
    from viz import pool_figure

    seen = 0
    for view in _run(load(Path("lessons") / "08_block_size.md")).run_all():
        labels = {i: f"{n} (seq {i})" for i, n in view.seq_names.items()}
        texts = [a.text or "" for a in pool_figure(view.snapshot, view.events,
                                                    seq_labels=labels).layout.annotations]
        for sid, name in view.seq_names.items():
            drawn = view.snapshot.sequences.get(sid)
            if drawn is not None and drawn.block_table:
                assert any(f"{name} (seq {sid})" in t for t in texts)
                seen += 1
    assert seen


def test_a_page_shows_its_key_sentence_first_and_folds_nothing() -> None:
    from lessons.page_text import page_markdown, split_key

    text = "Look at block 3. It is shared.\n\n> **The copy** holds the same\n> bytes.\n\nA last one."
    assert split_key(text) == ("**The copy** holds the same bytes.",
                               "Look at block 3. It is shared.\n\nA last one.")
    assert split_key("Look at block 3. It is shared.\n\nMore.") == ("Look at block 3.",
                                                                      "It is shared.\n\nMore.")
    view = _run(load(Path("lessons") / "07_fragmentation.md")).next()
    page = page_markdown(view)
    assert page.startswith(f"### {view.title}\n\n> ") and "<details>" not in page
    assert_readable_page(view)
