"""One prompt through the lab's vLLM, with what its KV events said about it: what lesson 15 and
the tests send when they hold vLLM's cache beside PagedLab's.

    answer = ask(server, prompt_ids, max_tokens=1, reset=False)
    answer.ok, answer.why            # False and why (no vLLM, no events) instead of an exception
    answer.cached_tokens             # vLLM's num_cached_tokens for the prompt
    answer.stored, answer.removed    # the hashes vLLM published while it answered, in order
    answer.cache                     # every hash in vLLM's prefix cache after it (sorted)

A watch joins the server's events first and catches up from its replay endpoint, so it knows
the cache as it is; the prompt goes to the OpenAI API as token ids (the same tokens PagedLab
holds); the events are read until none came for `quiet_s` (vLLM publishes a step's events just
after the step, so the HTTP answer can come first) and once more from the replay endpoint. What
another client made vLLM do meanwhile is counted too: events carry no request id.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.vllm.lab import LabServer
from engine.vllm.openai_client import VllmApiError
from engine.vllm.schema import VllmEvent
from engine.vllm.watch import VllmWatch

JOIN_S = 15.0  # the most a watch waits for vLLM's publisher to answer


@dataclass(frozen=True)
class VllmAnswer:
    ok: bool
    why: str = ""  # when not ok: what is missing, and how to see vLLM's half
    output: tuple[int, ...] = ()  # the tokens vLLM generated
    cached_tokens: int = 0  # vLLM's num_cached_tokens
    stored: tuple[int, ...] = ()  # hashes stored while it answered, in order
    removed: tuple[int, ...] = ()  # hashes removed (evicted) while it answered
    cache: tuple[int, ...] = ()  # every hash in vLLM's GPU prefix cache after it, sorted
    messages: int = 0  # KV event messages vLLM sent while it answered
    kinds: dict[str, int] = field(default_factory=dict)  # events by kind: stored, removed, cleared


def unavailable(why: str) -> VllmAnswer:
    return VllmAnswer(False, why)


def ask(server: LabServer, prompt_ids: list[int], max_tokens: int = 1, reset: bool = False,
        quiet_s: float = 0.4, most_s: float = 20.0) -> VllmAnswer:
    """Send one prompt (token ids, greedy) to `server` and read what its KV events said.
    `reset`: empty vLLM's prefix cache first (a server in dev mode only: the local one)."""
    client = server.client()
    try:
        with VllmWatch(server.events, server.replay, silence_s=JOIN_S) as watch:
            deadline = time.monotonic() + JOIN_S
            while not watch.joined and time.monotonic() < deadline:
                watch.poll(0.05)
            if not watch.joined:
                return unavailable(f"vLLM's KV events did not reach PagedLab: {watch.status()}")
            watch.catch_up()
            first = watch.last_seq + 1
            if reset:
                client.reset_prefix_cache()
            got = client.complete(list(prompt_ids), max_tokens)
            events = settle(watch, quiet_s, most_s) + watch.catch_up()
            mine = [e for e in events if e.seq >= first]
            return VllmAnswer(
                True, "", tuple(got["outputs"][0]), int(got["cached_tokens"]),
                tuple(h for e in mine if e.kind == "stored" for h in e.block_hashes),
                tuple(h for e in mine if e.kind == "removed" for h in e.block_hashes),
                tuple(sorted(watch.mirror.hashes())), len({e.seq for e in mine}),
                _kinds(mine))
    except (VllmApiError, ValueError) as err:
        return unavailable(str(err))


def settle(watch: VllmWatch, quiet_s: float, most_s: float) -> list[VllmEvent]:
    """Every event until none came for `quiet_s` (at most `most_s`)."""
    out: list[VllmEvent] = []
    deadline = time.monotonic() + most_s
    while time.monotonic() < deadline:
        got = watch.poll(quiet_s)
        if not got:
            break
        out += got
    return out


def _kinds(events: list[VllmEvent]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in events:
        out[e.kind] = out.get(e.kind, 0) + 1
    return out
