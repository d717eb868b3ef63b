"""Prompt lookup without a search: an index of a sequence's n-grams, grown as its tokens come.

Speculative decoding by prompt lookup proposes the tokens that followed an earlier occurrence of a
sequence's last n tokens (engine/core/speculation.py). Searching the whole text for them every
step costs a sequence's length a step; this index costs a few dictionary operations a step:

- every position e has a key, the hash of the `n_min` tokens before it (the token itself where
  n_min is 1); `head[key]` is the latest such position and `prev[e]` the one before it with
  the same key (a hash chain, as LZ77 compressors keep one);
- a proposal looks up the tail's `n_min`-gram and walks its chain back over at most `chain`
  earlier occurrences, the latest first, extending each match backwards up to `n_max` tokens; the
  longest match wins (the latest one among equals), and the tokens after it are the draft. With
  a chain as long as the occurrences, that is vLLM's rule (the latest earlier occurrence of the
  longest tail from n_max down to n_min); the cap bounds a step's work on text that loops.
- the draft is what followed the occurrence; where that runs into the tail itself (text that
  loops with a period shorter than k: the latest occurrence is one period back), it goes on
  repeating, as the loop would: k tokens where a plain copy would give one period.

Positions are indexed one behind the text: an occurrence must end before the tail (whose own
n-gram would always match itself). The index holds confirmed tokens only (never a draft); a
sequence whose tokens shrank below what it indexed (nothing does that today) is indexed afresh.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable


class NgramIndex:
    def __init__(self, n_min: int, n_max: int, chain: int = 8) -> None:
        self.n_min, self.n_max, self.chain = n_min, max(n_min, n_max), chain
        self.head: dict[int, int] = {}
        self.prev = array("i")  # prev[e]: the previous position whose n_min tokens before it match
        self.indexed = 0  # positions 0 .. indexed - 1 are in the chains

    def copy(self) -> NgramIndex:
        new = NgramIndex(self.n_min, self.n_max, self.chain)
        new.head, new.prev, new.indexed = dict(self.head), array("i", self.prev), self.indexed
        return new

    def catch_up(self, tokens: list[int], known: int) -> None:
        """Index every position up to `known - 1` (the tokens before it are all known). A
        sequence that backs off or cools down looks up rarely, so this often indexes many
        positions at once: their keys in C loops (`_keys`), then one pass for the chains."""
        if known < self.indexed:
            self.__init__(self.n_min, self.n_max, self.chain)
        start = self.indexed
        if known <= start:
            return
        head, get = self.head, self.head.get
        first = min(known, max(start, self.n_min))
        self.prev.extend([-1] * (first - start))  # fewer than n_min tokens before them
        links = []
        for e, key in zip(range(first, known), _keys(tokens, self.n_min, first, known),
                          strict=True):
            links.append(get(key, -1))
            head[key] = e
        self.prev.extend(links)
        self.indexed = known

    def propose(self, tokens: list[int], end: int, k: int) -> list[int]:
        """Up to k tokens that followed the best earlier occurrence of the tokens before `end`
        (tokens[:end] must all be known); [] when the tail's n_min-gram never occurred."""
        n = self.n_min
        if end <= n or k <= 0:
            return []
        self.catch_up(tokens, end)  # up to end - 1: the tail's own n-gram (ending at end) is not
        tail = tokens[end - n:end]
        e = self.head.get(tail[0] if n == 1 else hash(tuple(tail)), -1)
        best, best_len = -1, 0
        for _ in range(self.chain):
            if e < 0:
                break
            if tokens[e - n:e] == tail:  # a hash may collide: compare the tokens
                m = n
                while m < self.n_max and e - m - 1 >= 0 and tokens[e - m - 1] == tokens[end - m - 1]:
                    m += 1
                if m > best_len:
                    best, best_len = e, m
                    if m == self.n_max:
                        break
            e = self.prev[e]
        if best < 0:
            return []
        return continuation(tokens, best, end, k)


def _keys(tokens: list[int], n: int, first: int, end: int) -> Iterable[int]:
    """The key of each position e in [first, end), first >= n: the n tokens before it, hashed
    (one token is its own key)."""
    if n == 1:
        return tokens[first - 1:end - 1]
    return map(hash, zip(*[tokens[first - n + j:end - n + j] for j in range(n)], strict=True))


def continuation(tokens: list[int], start: int, end: int, k: int) -> list[int]:
    """k tokens from `start` on; past `end` (the text's end) the part from start repeats."""
    run = tokens[start:end]
    if len(run) >= k:
        return run[:k]
    return (run * (k // len(run) + 1))[:k]
