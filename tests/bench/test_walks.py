"""bench/slides_walk.py reads each lesson's outcome from pytest's report (the walk itself is the
bench's: 4 minutes on two quiet cores), and the suite's own walk and the bench's are one test."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.ui.test_slides_browser" name="test_every_page[03_fork_cow]" time="47.9"/>
<testcase classname="tests.ui.test_slides_browser" name="test_every_page[06_preemption]" time="71.6">
<failure message="AssertionError: 1 problems:&#10;06_preemption 3 1280x720: scrolls: 1280x731">...</failure>
</testcase></testsuite></testsuites>"""


def _walk():
    spec = importlib.util.spec_from_file_location("slides_walk", ROOT / "bench" / "slides_walk.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_each_lessons_outcome_and_its_problems_are_read_from_the_report():
    got = _walk().lessons_of(REPORT)
    assert got["03_fork_cow"] == {"passed": True, "skipped": False, "seconds": 47.9, "problems": ""}
    assert not got["06_preemption"]["passed"]
    assert "scrolls: 1280x731" in got["06_preemption"]["problems"]


def test_the_committed_walk_passed_every_lesson():
    """The bench's last committed run walked every lesson there is, each a slide on every page."""
    from lessons import load_all

    result = json.loads((ROOT / "bench" / "results" / "slides_walk.json").read_text())
    assert set(result["lessons"]) == {lesson.name for lesson in load_all()}
    assert all(v["passed"] for v in result["lessons"].values()), result["lessons"]
