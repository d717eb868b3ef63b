"""RequestState: what a caller may know about one unfinished serving request, as plain data.

The engine hands these out (`LLMEngine.request`, `LLMEngine.requests`) instead of its scheduler's
queues and sequence groups, so pages, lessons and rooms never hold the engine's insides.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.sequence import SequenceGroup


@dataclass(frozen=True)
class RequestState:
    request_id: int
    # "waiting", "running" or "swapped" (the scheduler queue that holds it), or "loading": running,
    # but waiting this step for its prefix blocks to come back from the CPU tier
    status: str
    num_prompt_tokens: int
    num_preemptions: int
    seq_ids: tuple[int, ...]  # every sequence the request made, finished ones included
    live_seq_ids: tuple[int, ...]  # those still going
    block_ids: tuple[int, ...]  # blocks its live sequences hold (every group), each once, in table order


def request_state(group: SequenceGroup, status: str) -> RequestState:
    """What a caller may know of `group`, which sits in the scheduler queue `status`."""
    live = group.live()
    blocks = [b for s in live for t in s.block_tables for b in t if b is not None]
    if status == "running" and any(s.loading for s in live):
        status = "loading"
    return RequestState(group.request_id, status, len(group.prompt_ids), group.num_preemptions,
                        tuple(s.seq_id for s in group.seqs), tuple(s.seq_id for s in live),
                        tuple(dict.fromkeys(blocks)))
