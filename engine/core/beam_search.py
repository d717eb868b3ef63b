"""One step of beam search, decided on candidate scores alone (torch-free).

Given each live beam's cumulative log probability and its best next tokens, pick the
continuations exactly as Hugging Face's beam search does: the top 2k candidates over all
(beam, token) pairs by accumulated log probability; of those, the first k that do not end
continue, and ending ones among the first k become finished hypotheses, scored by
log probability / length ** length_penalty. The engine then turns the choice into the paper's
operations: a beam with one surviving child continues itself, one with several is forked, one
with none is freed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field


def f32(x: float) -> float:
    """Round to float32, as HF accumulates beam scores in float32 (ties break the same way)."""
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass(frozen=True)
class Candidate:
    score: float  # accumulated log probability
    beam: int  # index of the parent beam in this step's list
    token: int


@dataclass
class Hypothesis:
    """A finished beam: its tokens and scores (its last token is never written to the cache)."""

    token_ids: list[int]
    cumulative_logprob: float
    score: float  # length-penalised
    finish_reason: str


@dataclass
class BeamChoice:
    continuing: list[Candidate] = field(default_factory=list)  # best first, at most k
    finished: list[Candidate] = field(default_factory=list)


def choose(
    beam_scores: list[float],
    top_tokens: list[list[tuple[int, float]]],
    width: int,
    ends: callable,
) -> BeamChoice:
    """beam_scores[i]: cumulative log prob of beam i; top_tokens[i]: its best (token, logprob)
    pairs, at least 2 * width of them; ends(token) -> True when that continuation finishes."""
    cands = [
        Candidate(f32(f32(score) + f32(lp)), i, tok)
        for i, (score, tops) in enumerate(zip(beam_scores, top_tokens, strict=True))
        for tok, lp in tops
    ]
    # stable sort: among equal scores, beam-major then token rank order, like a flattened topk
    cands.sort(key=lambda c: -c.score)
    choice = BeamChoice()
    for rank, c in enumerate(cands[: 2 * width]):
        if ends(c.token):
            if rank < width:
                choice.finished.append(c)
        elif len(choice.continuing) < width:
            choice.continuing.append(c)
    return choice


def length_penalised(cumulative_logprob: float, length: int, length_penalty: float) -> float:
    return cumulative_logprob / (length ** length_penalty)


def should_stop(finished: list[Hypothesis], best_running: float, cur_len: int, width: int,
                length_penalty: float) -> bool:
    """HF's default (early_stopping=False) heuristic: stop once `width` hypotheses are done and
    the best running beam, scored at the current length, cannot beat the worst of them."""
    if len(finished) < width:
        return False
    worst = min(h.score for h in finished)
    return length_penalised(best_running, cur_len, length_penalty) <= worst
