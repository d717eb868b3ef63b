"""When a step drafts, and what: speculative decoding's choices, made per sequence and per step.

A draft pays when the tokens it is expected to keep outweigh what verifying it costs: a step of
B sequences computing k + 1 tokens each takes `cost(B, k + 1)` times a decode step (the runtime
says what: on a GPU measured from its own steps, the lost overlap of async scheduling included;
on a CPU a fixed share per draft token). Drafts that fail must cost nothing, so:

- **what**: each decoding sequence keeps its text mirrored as a string (engine/core/
  ngram_index.py) and looks its tail up there: a search in C, no Python loop over its tokens;
- **how often**: a lookup that finds nothing makes the sequence wait before the next one, twice
  as long each time (up to MAX_WAIT steps), so text that never repeats costs almost no lookups;
- **whose**: each sequence keeps its acceptance rate, the share of its drafted tokens that were
  kept (recent drafts weigh most, as production engines adapt the draft per sequence; a prior of
  one kept in two, worth a 4-token draft, before it drafted). A draft the step does not take is
  not lost for that: it is kept as a *shadow* and compared with the tokens the sequence then
  really gets (the test a verification makes: greedy, the argmax; sampled, a draw that equals the
  draft as often as rejection sampling keeps it), so the rate learns without a verification
  step. One rejected draft makes the next try wait a little; a rate below PAUSE_BELOW (sampling
  keeps rejecting what the lookup copies: two 4-token drafts in a row) stops the sequence's
  drafting and lookups for COOL_FIRST steps, twice as long after each further rejected draft, up
  to COOL_MAX; a draft mostly kept ends the cool-down. A sequence whose drafts are not taken but
  still promise much looks up again next step (so that the batch's sequences meet in a step that
  pays); one that promises little waits as after a miss;
- **whether**: the step drafts when the tokens its drafts are expected to keep (each drafting
  sequence's rate times its draft's length) pay for the verification: B + kept >= cost x B.
  Otherwise it runs as a plain decode step, and what was proposed becomes the shadows.
  (The dry mode computes nothing: its cost is 1, so any draft found is verified, as the lessons
  expect.)

Under async scheduling a sequence whose last token is still on the device cannot draft (its
tail is not known). A step that verifies drafts never overlaps the next, so a drafting sequence
drafts every step. When nobody drafts, steps overlap; each sequence in flight then looks up the
tail it does know (all but that last token), under the same back-off and cool-down, and only
where the drafts found would pay by the same rule does the step land at once, so that the next
one can draft (`wants_lookup`). Such a draft's first token guesses the one in flight, and the
next step drafts on only where that guess comes true, so each counts its sequence's rate times
what it is expected to keep: a landing whose next step drafts nothing loses the overlap for
nothing (issue 44: sampled text whose lookups keep finding drafts landed steps at the prior's
one in two). Text that never repeats keeps every step overlapped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.core.ngram_index import NgramIndex
from engine.core.sequence import Sequence
from engine.core.speculation import accepted_prefix

MAX_WAIT = 32  # steps between a sequence's lookups while they keep finding nothing
PROMISING = 0.5  # a rate at least this: a sequence whose drafts are not taken looks up next step
PRIOR_KEPT, PRIOR_DRAFTED = 2.0, 4.0  # before any draft: a rate of 0.5, worth one 4-token draft
DECAY = 0.6  # each verified draft weighs the earlier ones down by this: the rate follows the text
PAUSE_BELOW = 0.2  # a rate under this (under 0.8 of a 4-token draft kept) pauses the drafting
COOL_FIRST, COOL_MAX = 8, 256  # steps of the first pause, and the longest


@dataclass
class DraftState:
    """One sequence's drafting: its n-gram index, its lookups' back-off, its acceptance."""

    index: NgramIndex
    wait: int = 0  # steps to wait after the next miss (doubles while lookups miss)
    next_lookup: int = 0  # the first step it may look up again
    kept: float = 0.0  # drafted tokens kept, recent drafts weighing most (decayed sums)
    drafted: float = 0.0
    cool: int = 0  # the next pause's length (0: not cooling down)
    paused_until: int = 0  # no draft and no lookup before this step
    shadow: tuple[int, tuple[int, ...]] | None = None  # (position, draft) not taken, to compare

    @property
    def rate(self) -> float:
        """The expected share of a draft's tokens kept."""
        return (self.kept + PRIOR_KEPT) / (self.drafted + PRIOR_DRAFTED)

    def copy(self) -> DraftState:
        """A copy for a checkpoint (its index too: it grows as the sequence does)."""
        return DraftState(self.index.copy(), self.wait, self.next_lookup, self.kept, self.drafted,
                          self.cool, self.paused_until, self.shadow)

    def back_off(self, step: int, cap: int = MAX_WAIT) -> None:
        """A lookup that gave nothing usable: the next try waits, twice as long each time (up
        to `cap` steps)."""
        self.next_lookup = step + 1 + min(self.wait, cap)
        self.wait = min(cap, 2 * self.wait or 1)

    def may_look(self, step: int) -> bool:
        return step >= self.next_lookup and step >= self.paused_until


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

    def due(self, seqs: list[Sequence], step: int) -> list[Sequence]:
        """Those of `seqs` this step's drafting has anything to do for: new to drafting, a
        shadow draft to compare, or free to look up. The rest (backing off after a miss,
        cooling down) `propose` and `wants_lookup` would pass over untouched; this runs for
        every decoding sequence of every step, so it skips them in one comprehension, no call
        per sequence (issue 44: a step that drafts nothing costs what one without drafts
        does)."""
        return [s for s in seqs if (st := s.drafting) is None or st.shadow is not None
                or (step >= st.next_lookup and step >= st.paused_until)]

    def propose(self, seq: Sequence, k: int, step: int) -> list[int]:
        """The sequence's draft of up to k tokens, or [] (none found, backing off or paused)."""
        st = self.state(seq)
        if st.shadow is not None:
            self._settle_shadow(st, seq.token_ids, seq.num_tokens, step)
        if not st.may_look(step):
            return []
        draft = st.index.propose(seq.token_ids, seq.num_tokens, k)
        if not draft:
            st.back_off(step)
        return draft

    def expected(self, seq: Sequence, draft_len: int) -> float:
        """The draft tokens this sequence is expected to keep of a draft of `draft_len`."""
        return self.state(seq).rate * draft_len

    def pays(self, drafts: list[tuple[Sequence, list[int]]], num_decodes: int,
             in_flight: bool = False) -> bool:
        """Whether verifying these drafts beats a plain decode step of `num_decodes` sequences.
        `in_flight`: drafts found from before a token still on the device (`wants_lookup`),
        whose first token guesses it: the next step drafts on from there only where the guess
        comes true, as likely as any draft token is kept (the rate), so each counts that much
        of what it is expected to keep."""
        if not drafts:
            return False
        gain = sum(self.expected(s, len(d)) * (self.state(s).rate if in_flight else 1.0)
                   for s, d in drafts)
        return num_decodes + gain >= self.cost(num_decodes, 1 + self.max_tokens) * num_decodes

    def choose(self, drafts: list[tuple[Sequence, list[int]]], num_decodes: int, step: int
               ) -> list[tuple[Sequence, list[int]]]:
        """The drafts this step verifies: all of them when they pay (a drafting sequence's
        lookups go on every step), else none, and those sequences back off their lookups."""
        if self.pays(drafts, num_decodes):
            for seq, _ in drafts:
                st = self.state(seq)
                st.wait, st.shadow = 0, None  # verified for real
            return drafts
        self._unused([(s, s.num_tokens, d) for s, d in drafts], step)
        return []

    def verified(self, seq: Sequence, drafted: int, kept: int, step: int) -> None:
        """A draft was verified: the sequence's acceptance follows its latest drafts."""
        self._learn(self.state(seq), drafted, kept, step)

    def _learn(self, st: DraftState, drafted: int, kept: int, step: int) -> None:
        """`kept` of a draft of `drafted` tokens were (or would have been) kept. Below
        PAUSE_BELOW the sequence pauses (longer each time it is still rejected); a draft mostly
        kept ends the cool-down."""
        st.kept = DECAY * st.kept + kept
        st.drafted = DECAY * st.drafted + drafted
        if st.rate < PAUSE_BELOW:
            st.cool = min(COOL_MAX, 2 * st.cool or COOL_FIRST)
            st.paused_until = step + 1 + st.cool
        elif 2 * kept >= drafted:
            st.cool = 0
        elif kept == 0:
            st.back_off(step)  # one rejected draft: the next try a little later

    def _settle_shadow(self, st: DraftState, tokens: list[int], known: int, step: int) -> None:
        """Compare the shadow draft with the tokens that came after its position (the first
        `known` of `tokens` are known): learn from it once a token differs or all have come."""
        pos, draft = st.shadow
        have = min(len(draft), known - pos)
        if have <= 0:
            return
        kept = accepted_prefix(list(draft[:have]), tokens[pos:pos + have])
        if kept < have or have == len(draft):
            st.shadow = None
            self._learn(st, len(draft), kept, step)

    def wants_lookup(self, in_flight: list[Sequence], step: int, num_decodes: int | None = None
                     ) -> bool:
        """Should this step land at once (async scheduling), so that the next one can draft for
        these sequences whose last token is still on the device? Where the tails they know
        already continue an earlier occurrence (their text has started to repeat) and drafts of
        those sequences would pay in a step of `num_decodes` (default: them alone)."""
        found: list[tuple[Sequence, int, list[int]]] = []
        k = max(1, self.max_tokens)
        for seq in in_flight:
            st = self.state(seq)
            tokens = seq.token_ids
            known = len(tokens) - 1  # the last token is still on the device
            if st.shadow is not None:
                self._settle_shadow(st, tokens, known, step)
            if not st.may_look(step) or known < 1:
                continue
            draft = st.index.propose(tokens, known, k)  # from the token in flight on
            if draft:
                found.append((seq, known, draft))
            else:
                st.back_off(step)
        if not found:
            return False
        if self.pays([(s, d) for s, _, d in found], num_decodes or len(in_flight), in_flight=True):
            return True
        self._unused(found, step)
        return False

    def _unused(self, drafts: list[tuple[Sequence, int, list[int]]], step: int) -> None:
        """Drafts found (each at its position) that the step does not take: each becomes its
        sequence's shadow (unless one waits already), and the sequence looks up again next step
        where its rate promises much, else waits as after a miss."""
        for seq, pos, draft in drafts:
            st = self.state(seq)
            if st.shadow is None:
                st.shadow = (pos, tuple(draft))
            if st.rate >= PROMISING:
                st.next_lookup = step + 1
            else:
                st.back_off(step)
