"""Speculative decoding's two torch-free rules: what to draft, and how much of it to keep.

**Drafting by prompt lookup** (vLLM's "ngram" method): a sequence whose last n tokens occurred
earlier in its prompt or output proposes the tokens that followed that occurrence, trying the
longest n first (engine/core/ngram_index.py keeps each sequence's n-grams; when a step drafts is
engine/core/draft_policy.py's). No second model: text that repeats itself (code, an edit of a
given document, a summary quoting its source) drafts well; free prose rarely does.

**Verification**: the target model computes the pending token and the k drafts in one pass, a
query of k + 1 positions, and the step picks a token at each position exactly as it would
without drafts (the same sampler, the same per-position random number). Draft j is kept while
every pick before it equals its draft; the first pick that differs is the correction, and when
all k match, the pick after the last draft is a bonus token. For a draft that is a single
proposed token (a point mass) this is rejection sampling: the draft is kept with the target's
probability of it, and a rejected one is replaced by a sample of the target without that token,
so every output token has the target's distribution. Greedy requests get exactly the tokens of
the engine without drafts.
"""

from __future__ import annotations


def accepted_prefix(draft: list[int], picks: list[int]) -> int:
    """How many leading draft tokens the target's picks confirm (picks[j] is the target's token
    after draft[:j])."""
    a = 0
    while a < len(draft) and picks[a] == draft[a]:
        a += 1
    return a
