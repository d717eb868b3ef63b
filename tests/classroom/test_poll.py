"""A lesson played in a room, its questions polled (classroom/poll.py), without a server: the
class's answers counted once per student and changeable until the reveal, the engine's answer
computed by the step the teacher's Next runs, names kept from everyone without the secret, a
late joiner given the open question, every refusal a sentence that changes nothing. The room is
dry; the lesson (02_paging) runs on the real default model, as a class would see it."""

from __future__ import annotations

import json

import pytest

from classroom import RoomError, RoomRegistry
from classroom.poll import LESSON_NAMES

DRY = {"model": "dry", "block_size": 4, "num_blocks": 48, "swap_blocks": 8, "max_tokens": 6}
pytestmark = pytest.mark.model


@pytest.fixture
def room(default_model):
    reg = RoomRegistry(max_rooms=1)
    r = reg.open(DRY)
    yield r
    reg.close_all()


def poll(room) -> dict:
    return room.lesson.view.public()


def play(room) -> None:
    """Play lesson 2 to its first question (page 1: its opening page asks nothing)."""
    room.lesson_control(room.secret, "play", "02_paging")
    assert poll(room)["page"] == 0 and poll(room)["question"] is None
    room.lesson_control(room.secret, "next")


def test_a_class_answers_a_number_question_and_sees_how_it_split(room):
    assert "02_paging" in LESSON_NAMES
    play(room)
    q = poll(room)["question"]
    assert q["kind"] == "number" and "How many blocks" in q["text"]  # asked before the step runs
    sent = {}
    for i in range(30):  # 20 say 2 blocks (the prompt's 7 tokens in blocks of 4), 10 say 3
        sent[f"student-{i}"] = "2" if i < 20 else "3 blocks"
        assert room.answer(f"student-{i}", sent[f"student-{i}"], f"S{i}") in ("2 blocks", "3 blocks")
    room.answer("student-0", "7", "S0")  # a changed answer replaces the first: counted once
    assert poll(room)["answered"] == 30
    late = poll(room)  # a student who joins now reads the open question
    assert late["question"] == q and late["reveal"] is None
    said = room.lesson_control(room.secret, "next")
    reveal = poll(room)["reveal"]
    assert reveal["answer"] == "2 blocks" and "2 blocks" in said
    assert {c["answer"]: (c["students"], c["right"]) for c in reveal["counts"]} == {
        "2 blocks": (19, True), "3 blocks": (10, False), "7 blocks": (1, False)}
    assert reveal["answered"] == 30 and reveal["right"] == 19
    # closed: an answer now goes to the page's next question, never to the one revealed
    assert poll(room)["question"]["step"] == q["step"] + 1
    room.answer("student-5", "no")
    assert poll(room)["reveal"]["answered"] == 30 and poll(room)["answered"] == 1


def test_choices_and_blocks_are_read_as_their_kind_and_nonsense_is_refused(room):
    play(room)
    room.lesson_control(room.secret, "next")  # the number question revealed
    q = poll(room)["question"]
    assert q["kind"] == "choice" and q["choices"] == ["yes", "no"]
    with pytest.raises(RoomError, match="choose one of: yes \\| no"):
        room.answer("a", "maybe")
    assert poll(room)["answered"] == 0  # a refused answer records nothing
    room.answer("a", "Yes")
    room.answer("b", "no")
    room.lesson_control(room.secret, "next")
    counts = {c["answer"]: c["students"] for c in poll(room)["reveal"]["counts"]}
    assert counts == {"yes": 1, "no": 1}
    q = poll(room)["question"]  # the page that revealed it asks the next: which block
    assert q["kind"] == "block"
    with pytest.raises(RoomError, match="from 0 to"):
        room.answer("a", str(q["num_blocks"]))
    room.answer("a", "block 3")
    room.lesson_control(room.secret, "next")
    reveal = poll(room)["reveal"]
    assert reveal["counts"][0]["answer"] == "block 3"
    assert reveal["answer"].startswith("block ")
    assert reveal["counts"][0]["right"] == (reveal["answer"] == "block 3")
    room.lesson.run.engine.check_invariants()


def test_names_stay_with_the_teacher_and_a_student_cannot_reveal(room):
    play(room)
    room.answer("k1", "2", "Ada")
    room.answer("k2", "4", "Grace")
    assert "Ada" not in json.dumps(poll(room)) and "Grace" not in json.dumps(poll(room))
    with pytest.raises(RoomError, match="only the teacher"):
        room.lesson_control("a guess", "next")
    with pytest.raises(RoomError, match="only the teacher"):
        room.poll_answers("a guess")
    assert poll(room)["question"] is not None and poll(room)["answered"] == 2  # nothing changed
    who = room.poll_answers(room.secret)
    assert [(a["student"], a["answer"], a["revealed"]) for a in who] == [
        ("Ada", "2 blocks", None), ("Grace", "4 blocks", None)]
    room.lesson_control(room.secret, "next")
    room.answer("k2", "yes", "Grace")  # the next page's question, already open
    who = room.poll_answers(room.secret)
    assert [(a["student"], a["revealed"], a["right"], a["answer"]) for a in who] == [
        ("Ada", "2 blocks", True, None), ("Grace", "4 blocks", False, "yes")]


def test_a_lesson_that_is_not_there_or_not_playing_is_refused_in_words(room):
    with pytest.raises(RoomError, match="no lesson is called"):
        room.lesson_control(room.secret, "play", "99_nothing")
    with pytest.raises(RoomError, match="not playing a lesson"):
        room.answer("a", "2")
    with pytest.raises(RoomError, match="play one first"):
        room.lesson_control(room.secret, "next")
    with pytest.raises(RoomError, match="unknown lesson action"):
        room.lesson_control(room.secret, "rewind")
    room.lesson_control(room.secret, "play", "02_paging")
    while not poll(room)["done"]:
        room.lesson_control(room.secret, "next")
    with pytest.raises(RoomError, match="at its end"):
        room.lesson_control(room.secret, "next")
    assert room.lesson_control(room.secret, "end") == "the lesson ended" and room.lesson is None
