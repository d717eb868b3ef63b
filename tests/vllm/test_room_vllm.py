"""A classroom room served by the real vLLM of this folder (classroom/vllm_room.py): students'
prompts go to vLLM's OpenAI API after the room's system prompt, the room's published view holds
vLLM's cache from its KV events (the same hashes a watch of the server sees), the projector draws
it, and what only PagedLab's engine can do is refused with a sentence."""

from __future__ import annotations

import time

import pytest

from classroom import RoomError, RoomRegistry
from tests.vllm.conftest import settle
from ui.room_render import metrics_html, projector_figure, requests_html

pytestmark = pytest.mark.slow

SYSTEM = ("You are a patient tutor for a class learning how language models keep their memory. "
          "You answer every question in one short sentence, with a simple example when it helps.")


def test_a_room_served_by_vllm_draws_its_cache(vllm_server, vllm_watch):
    rooms = RoomRegistry("cpu")
    room = rooms.open({"served_by": "vllm", "system_prompt": SYSTEM, "max_tokens": 8})
    try:
        a = room.submit("ana", "What is a KV cache?", "Ana")
        b = room.submit("ben", "Why are blocks a fixed size?", "Ben")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(
                r["status"] != "done" for r in room.view.state["requests"]):
            time.sleep(0.2)
        done = {r["id"]: r for r in room.view.state["requests"]}
        assert {done[a]["status"], done[b]["status"]} == {"done"}
        assert done[a]["text"] and not done[a]["text"].startswith("vLLM did not answer")
        settle(vllm_watch)
        want = vllm_watch.mirror.hashes()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and {n.block_hash for n in room.view.tree.nodes} != want:
            time.sleep(0.1)
        assert {n.block_hash for n in room.view.tree.nodes} == want and want
        fig = projector_figure(room.view, (1000, 600), True)
        assert "vLLM's cache, from its events" in fig.layout.title.text
        assert "served by vLLM" in metrics_html(room.view) and "Ana" in requests_html(room.view)
        with pytest.raises(RoomError, match="vLLM schedules its own steps"):
            room.control(room.secret, "pause")
        assert "cleared" in room.control(room.secret, "clear")
    finally:
        rooms.close_all()


def test_a_room_served_by_vllm_needs_one(monkeypatch):
    from engine.vllm import lab

    monkeypatch.delenv(lab.ENV, raising=False)
    with pytest.raises(RoomError, match="no vLLM runs beside PagedLab here"):
        RoomRegistry("cpu").open({"served_by": "vllm"})
    with pytest.raises(RoomError, match="served_by must be one of"):
        RoomRegistry("cpu").open({"served_by": "gpt"})
