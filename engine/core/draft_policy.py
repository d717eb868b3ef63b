"""When a step drafts, and what: speculative decoding's choices, made per sequence and per step.

A draft pays when the tokens it is expected to keep outweigh what verifying it costs: a step of
B sequences computing k + 1 tokens each takes `cost(B, k + 1)` times a decode step (the runtime
measures it: on a GPU from the captured graphs, about 1 for small batches of a small model, more
as the batch fills the GPU). So:

- **what**: each decoding sequence keeps an n-gram index of its text (engine/core/ngram_index.py)
  and looks its tail up there: a few dictionary operations, not a search of the text;
- **how often**: a lookup that finds nothing makes the sequence wait before the next one, twice
  as long each time (up to MAX_WAIT steps), so text that never repeats costs almost nothing;
- **whether**: the step drafts when B plus the tokens its drafts are expected to keep (each
  sequence's recent share of kept drafts times its draft's length) is at least `cost` times B;
  otherwise it runs as a plain decode step and nobody drafts. (The dry mode computes nothing:
  its cost is 1, so any draft found is verified, as the lessons expect.)

Under async scheduling a sequence whose last token is still on the device cannot draft (its
tail is not known). A step that verifies drafts never overlaps the next, so a drafting sequence
drafts every step. When nobody drafts, steps overlap; each sequence in flight then looks up the
tail it does know (all but that last token), under the same back-off, and only where that finds
something (text that started to repeat) does the step land at once, so that the next one can
draft (`wants_lookup`). Text that never repeats keeps every step overlapped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.core.ngram_index import NgramIndex
from engine.core.sequence import Sequence

MAX_WAIT = 32  # steps between a sequence's lookups while they keep finding nothing
FIRST_RATE = 0.5  # the share of drafted tokens a sequence is expected to keep before it drafted


@dataclass
class DraftState:
    """One sequence's drafting: its n-gram index, its lookups' back-off, its kept share."""

    index: NgramIndex
    wait: int = 0  # steps to wait after the next miss (doubles while lookups miss)
    next_lookup: int = 0  # the first step it may look up again
    rate: float = FIRST_RATE  # recent share of its drafted tokens that were kept

    def copy(self) -> DraftState:
        """A copy for a checkpoint (its index too: it grows as the sequence does)."""
        return DraftState(self.index.copy(), self.wait, self.next_lookup, self.rate)

    def back_off(self, step: int) -> None:
        """A lookup or a draft that gave nothing: the next try waits, twice as long each time."""
        self.next_lookup = step + 1 + self.wait
        self.wait = min(MAX_WAIT, 2 * self.wait or 1)


@dataclass
class DraftPolicy:
    n_min: int
    n_max: int
    max_tokens: int  # k: draft tokens a sequence proposes at most
    cost: Callable[[int, int], float]  # (sequences, queries each) -> verification / decode time

    STATE = ()  # none (engine/core/state.py): each sequence keeps its own `DraftState`
    FIXED = ("n_min", "n_max", "max_tokens", "cost")

    def state(self, seq: Sequence) -> DraftState:
        """The sequence's drafting state, kept on the sequence (it goes when the sequence does;
        a fork starts its own index)."""
        if seq.drafting is None:
            seq.drafting = DraftState(NgramIndex(self.n_min, self.n_max))
        return seq.drafting

    def propose(self, seq: Sequence, k: int, step: int) -> list[int]:
        """The sequence's draft of up to k tokens, or [] (none found, or still backing off)."""
        st = self.state(seq)
        if step < st.next_lookup:
            return []
        draft = st.index.propose(seq.token_ids, seq.num_tokens, k)
        if draft:
            st.wait = 0
        else:
            st.back_off(step)
        return draft

    def pays(self, drafts: list[tuple[Sequence, list[int]]], num_decodes: int) -> bool:
        """Whether verifying these drafts beats a plain decode step of `num_decodes` sequences."""
        if not drafts:
            return False
        expected = num_decodes + sum(self.state(s).rate * len(d) for s, d in drafts)
        return expected >= self.cost(num_decodes, 1 + self.max_tokens) * num_decodes

    def verified(self, seq: Sequence, drafted: int, kept: int, step: int) -> None:
        """A draft was verified: the sequence's kept share follows its latest drafts; a draft
        of which nothing was kept makes it wait as a miss does."""
        st = self.state(seq)
        st.rate = 0.7 * st.rate + 0.3 * (kept / drafted if drafted else 0.0)
        if kept == 0:
            st.back_off(step)

    def wants_lookup(self, in_flight: list[Sequence], step: int) -> bool:
        """Should this step land at once (async scheduling), so that the next one can draft for
        these sequences whose last token is still on the device? Where the tail they know
        already continues an earlier occurrence: their text has started to repeat."""
        found = False
        for seq in in_flight:
            st = self.state(seq)
            if step < st.next_lookup or seq.num_tokens < 2:
                continue
            if st.index.propose(seq.token_ids, seq.num_tokens - 1, 1):
                found = True
            else:
                st.back_off(step)
        return found
