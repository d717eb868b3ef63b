"""bench/walks.py reads each case's outcome from pytest's report (the walks themselves are the
bench's: minutes on two cores), and the committed result of each walk covers every case there is:
every lesson as slides, every value of every lesson's inputs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.ui.test_slides_browser" name="test_every_page[03_fork_cow]" time="47.9"/>
<testcase classname="tests.ui.test_slides_browser" name="test_every_page[06_preemption]" time="71.6">
<failure message="AssertionError: 1 problems:&#10;06_preemption 3 1280x720: scrolls: 1280x731">...</failure>
</testcase></testsuite></testsuites>"""


def _walks():
    spec = importlib.util.spec_from_file_location("walks", ROOT / "bench" / "walks.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("walks", mod)  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


def _committed(walk: str) -> dict:
    return json.loads((ROOT / "bench" / "results" / _walks().WALKS[walk].result).read_text())


def test_each_cases_outcome_and_its_problems_are_read_from_the_report():
    got = _walks().cases_of(REPORT)
    assert got["03_fork_cow"] == {"passed": True, "skipped": False, "seconds": 47.9, "problems": ""}
    assert not got["06_preemption"]["passed"]
    assert "scrolls: 1280x731" in got["06_preemption"]["problems"]


def test_the_committed_slides_walk_passed_every_lesson():
    """The last committed walk took every lesson there is, each a slide on every page."""
    from lessons import load_all

    result = _committed("slides")
    assert set(result["cases"]) == {lesson.name for lesson in load_all()}
    assert all(v["passed"] for v in result["cases"].values()), result["cases"]


def test_the_committed_inputs_walk_played_every_value_of_every_input():
    from tests.lessons.test_lesson_inputs import ALL_CASES, WALK_ONLY, case_id

    result = _committed("lesson-inputs")
    assert set(result["cases"]) >= {case_id(c) for c in ALL_CASES}
    assert all(v["passed"] for v in result["cases"].values()), result["cases"]
    assert any(c[0] in WALK_ONLY for c in ALL_CASES), "the suite leaves nothing out: drop the walk"
