"""Lesson 15 with the real vLLM of this folder beside it (the lab adopts it: tests/vllm/conftest.py
names it in PAGEDLAB_VLLM_SERVER): vLLM's half of every page is shown, its checks (the same
hashes, the same prefix hit) hold against the real server, and the page's numbers are the
engines'. Without vLLM the lesson plays PagedLab's half only (tests/lessons plays it so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lessons import LessonRun, load

pytestmark = pytest.mark.slow

LESSON = Path(__file__).resolve().parents[2] / "lessons" / "15_vllm_same_cache.md"


def test_lesson_15_shows_vllms_half_with_the_same_hashes(vllm_server):
    run = LessonRun(load(LESSON), device="cpu", dtype="float32")
    pages = []
    while not run.done:
        pages.append(run.next().narration_markdown)  # a check that fails raises
    same, hit = pages[1], pages[2]
    assert "with PagedLab's hashes, in the same order" in same, same
    assert "vLLM's hashes, from its KV events:" in same
    assert "vLLM reports **" in hit and "the same hit" in hit, hit
    assert "a prefix hit publishes no event" in hit
    assert "vLLM's cache holds" in pages[3]
