"""What a lesson offers the learner must work (issue 42, item 12): every value of every input a
lesson offers plays the lesson to its end with every check holding, on the engine the lesson
names (dry or the real model); and the end's score reads right when questions were skipped."""

from __future__ import annotations

import os

import pytest

from lessons import LessonRun, load_all
from lessons.questions import Score

LESSONS = {lesson.name: lesson for lesson in load_all()}
# (lesson, param, value) for every value of every input but the default (the default is the
# lesson as tests/lessons/test_lessons.py plays it)
ALL_CASES = [(name, p.name, value) for name, lesson in LESSONS.items() for p in lesson.params
             for value in p.choices if value != p.default]
# each plays to its end in tests/lessons/test_lessons.py with its default values
WALK_ONLY = ("01_kv_cache", "06_preemption", "10_tensor_parallel", "11_chunked_prefill")
EVERY = os.environ.get("PAGEDLAB_LESSON_INPUTS") == "all"
CASES = [case for case in ALL_CASES if EVERY or case[0] not in WALK_ONLY]


def case_id(case: tuple) -> str:
    return f"{case[0]}-{case[1]}={case[2]}".replace(" ", "_")[:60]


def test_a_skipped_question_is_said_as_skipped() -> None:
    run = LessonRun(LESSONS["07_fragmentation"])  # dry, one question
    assert run.lesson.steps and sum(s.question is not None for s in run.lesson.steps) == 1
    run.run_all()
    said = run.score().sentence()
    assert "none of the 1 question" not in said and "1 question" not in said, said
    assert said == "you did not predict its question"
    assert Score(0, 0, 3).sentence() == "you predicted none of its 3 questions"
    assert Score(1, 2, 3).sentence() == "you predicted 1 of 2 right (1 not answered)"


@pytest.mark.parametrize("name,param,value", [
    pytest.param(*case, id=case_id(case),
                 marks=[] if LESSONS[case[0]].dry else [pytest.mark.slow]) for case in CASES])
def test_every_value_an_input_offers_plays_the_lesson_to_its_end(name: str, param: str, value,
                                                                  request) -> None:
    if not LESSONS[name].dry:
        request.getfixturevalue("default_model")  # the shared weights, loaded once
    run = LessonRun(LESSONS[name], params={param: value})
    try:
        views = run.run_all()  # a check that fails, or an op that cannot run, raises here
        assert run.done and len(views) == len(run.lesson.steps)
        assert [len(v.checks) for v in views] == [len(s.checks) for s in run.lesson.steps]
    finally:
        run.close()
