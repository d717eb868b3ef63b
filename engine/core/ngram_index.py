"""Prompt lookup by a search in C: each sequence's known tokens mirrored as a string, one
character a token, and its tail found in it with `str.rfind`.

Speculative decoding by prompt lookup proposes the tokens that followed an earlier occurrence of a
sequence's last n tokens (engine/core/speculation.py). Searching the token list in Python costs a
sequence's length a step, and so did indexing every position as it came, in a Python loop (issue
44: 0.26 us a token, half of what drafting cost the host in a batch of 64 whose drafts sampling
rejects: 27 of 53 us a step, bench/spec_host.py's dry mode on the 2-core CPU). Here the only
per-token work is in C (the catch-up now 8 us of 38 there):

- the mirror grows by the tokens a lookup has not seen yet, `chr` of each joined in one call
  (a sequence that backs off or cools down catches up on dozens at once);
- a proposal finds the latest occurrences of the tail's `n_min` tokens by `rfind`, each search
  going on before the last one found, over at most `chain` of them, and extends each match
  backwards up to `n_max` tokens; the longest match wins (the latest one among equals), and the
  tokens after it are the draft. With a chain as long as the occurrences, that is vLLM's rule
  (the latest earlier occurrence of the longest tail from n_max down to n_min); the cap bounds a
  step's work on text that loops. A tail that never occurred costs one search of the whole text
  in C (5-25 us at 32,768 tokens on that CPU, for tails of one or two tokens), and its sequence
  then backs off (engine/core/draft_policy.py);
- the draft is what followed the occurrence; where that runs into the tail itself (text that
  loops with a period shorter than k: the latest occurrence is one period back), it goes on
  repeating, as the loop would: k tokens where a plain copy would give one period.

An occurrence must end before the tail's last token (the tail would always match itself). The
mirror holds confirmed tokens only (never a draft, never the placeholder of a token still on the
device); token ids are characters, so they must lie in [0, 0x110000), as every vocabulary's do.
A sequence whose tokens shrank below what was mirrored (nothing does that today) is cut back.
"""

from __future__ import annotations

MAX_TOKEN_ID = 0x10FFFF  # the largest character: a token id is its character in the mirror


class NgramIndex:
    def __init__(self, n_min: int, n_max: int, chain: int = 8) -> None:
        self.n_min, self.n_max, self.chain = n_min, max(n_min, n_max), chain
        self.text = ""  # tokens[:indexed], a character each
        self.indexed = 0

    def copy(self) -> NgramIndex:
        new = NgramIndex(self.n_min, self.n_max, self.chain)
        new.text, new.indexed = self.text, self.indexed  # a string is immutable: shared
        return new

    def catch_up(self, tokens: list[int], known: int) -> None:
        """Mirror tokens[:known] (all known)."""
        if known < self.indexed:
            self.text, self.indexed = self.text[:known], known
        elif known > self.indexed:
            self.text += _chars(tokens, self.indexed, known)
            self.indexed = known

    def propose(self, tokens: list[int], end: int, k: int) -> list[int]:
        """Up to k tokens that followed the best earlier occurrence of the tokens before `end`
        (tokens[:end] must all be known); [] when the tail's n_min-gram never occurred."""
        n = self.n_min
        if end <= n or k <= 0:
            return []
        self.catch_up(tokens, end)
        text, find = self.text, self.text.rfind
        tail = text[end - n:end]
        best, best_len = -1, 0
        hi = end - 1  # an occurrence ends at e <= hi, before the tail's last token
        for _ in range(self.chain):
            s = find(tail, 0, hi)
            if s < 0:
                break
            e = s + n
            m = n
            while m < self.n_max and s - 1 >= 0 and text[s - 1] == text[end - m - 1]:
                m, s = m + 1, s - 1
            if m > best_len:
                best, best_len = e, m
                if m == self.n_max:
                    break
            hi = e - 1  # the next occurrence ends before this one does
        if best < 0:
            return []
        return continuation(tokens, best, end, k)


def _chars(tokens: list[int], start: int, end: int) -> str:
    """tokens[start:end] as a string, a character a token id; an id no character can be (a
    placeholder, a negative number) is refused by name."""
    try:
        return "".join(map(chr, tokens[start:end]))
    except (ValueError, OverflowError, TypeError):
        bad = next(t for t in tokens[start:end] if not (isinstance(t, int) and 0 <= t <= MAX_TOKEN_ID))
        raise ValueError(f"token id {bad!r} cannot be looked up: prompt lookup takes ids in "
                         f"[0, {MAX_TOKEN_ID}] (confirmed tokens only, never a placeholder)") from None


def continuation(tokens: list[int], start: int, end: int, k: int) -> list[int]:
    """k tokens from `start` on; past `end` (the text's end) the part from start repeats."""
    run = tokens[start:end]
    if len(run) >= k:
        return run[:k]
    return (run * (k // len(run) + 1))[:k]
