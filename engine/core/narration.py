"""The one-line narration of an event, built when a view asks for it.

An event keeps ids and numbers only (`engine.core.events.Event`); its sentence is written here
on first read of `event.text`. A serving step at scale makes thousands of events a second that
no view reads, so building their text (and decoding their tokens) eagerly is wasted host time.

Each sentence is a function of one event: its ids, its `facts` (the few numbers the sentence
needs besides the ids, captured when the event happened, since the pool changes after) and,
for the sentences that name a token, its `names` (how a token is shown to a person).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.core.sequence import IN_FLIGHT


def plural(n: int, one: str, many: str | None = None) -> str:
    """'1 block', '2 blocks', '0 blocks' ('1 KV head', '3 sequences'); `many` for irregular words."""
    return f"{n} {one if n == 1 else (many if many is not None else one + 's')}"


def blocks_str(block_ids: list[int] | tuple[int, ...]) -> str:
    """'block 3' or 'blocks 3, 4, 7' for narration."""
    ids = ", ".join(str(b) for b in block_ids)
    return f"block {ids}" if len(block_ids) == 1 else f"blocks {ids}"


class TokenNames:
    """How a sentence shows one token: its decoded text, quoted (`repr`), memoised (a step names
    hundreds of tokens, mostly the same few). Holds the tokenizer's `decode`, never the engine:
    an event that pointed back at the engine would keep its KV pool alive until the GC ran.
    All instances compare equal: two events are the same whatever tokenizer would show them."""

    __slots__ = ("_decode", "_shown")

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._shown: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._shown.get(token_id)
        if text is None:
            text = self._shown[token_id] = repr(self._decode([token_id]))
        return text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenNames)

    def __hash__(self) -> int:
        return hash(TokenNames)

    def __getstate__(self) -> Callable[[list[int]], str]:
        return self._decode

    def __setstate__(self, decode: Callable[[list[int]], str]) -> None:
        self.__init__(decode)


def narrate(e: Any) -> str:
    """The sentence of one event (an `Event`): its form's if it has one, else its kind's."""
    return _SENTENCES[e.form or e.kind](e)


def _token(e: Any) -> str:
    tok = e.token_ids[0]
    return (e.names or repr)(tok)


def _append(e: Any) -> str:
    what = "the token it sampled last step (still on the GPU)" if e.token_ids[0] == IN_FLIGHT \
        else _token(e)
    if len(e.block_ids) > 1:  # a hybrid model: the same slot in every KV cache group's block
        return f"seq {e.seq_id} wrote {what} into slot {e.slot} of {blocks_str(e.block_ids)}"
    return f"seq {e.seq_id} wrote {what} into slot {e.slot} of block {e.block_ids[0]}"


def _free(e: Any) -> str:
    cached, kept = e.facts
    text = f"seq {e.seq_id} freed"
    if e.block_ids:
        text += f": {blocks_str(e.block_ids)} back in the pool"
        if cached:
            text += f" ({blocks_str(cached)} {'stays' if len(cached) == 1 else 'stay'} cached)"
    if kept:
        text += f"; {blocks_str(kept)} still used by others (ref count - 1)"
    return text


def _swap(e: Any) -> str:
    pairs = zip(e.block_ids[::2], e.block_ids[1::2], strict=True)
    seqs = ", ".join(str(s) for s in e.facts)
    if e.kind == "swap_out":
        return f"swapped out seq {seqs}: " + ", ".join(f"{g}→cpu {c}" for g, c in pairs)
    return f"swapped in seq {seqs}: " + ", ".join(f"cpu {c}→{g}" for c, g in pairs)


def _prefill(e: Any) -> str:
    """A serving step's prefill: whole, or which chunk of a chunked prompt."""
    resumed, final, whole, start, num_tokens, num_new, cached, rest = e.facts
    what = "recompute after preemption" if resumed else "prefill"
    if whole:
        return (f"seq {e.seq_id}: {what} of {plural(num_tokens, 'token')}, {num_new} computed, "
                f"{cached} from the prefix cache")
    left = "the last chunk" if final else f"{rest} to go"
    from_cache = f" ({cached} from the prefix cache)" if cached else ""
    return (f"seq {e.seq_id}: chunked {what}: tokens {start}–{num_tokens - 1} of "
            f"{num_tokens + rest} computed{from_cache}, {left}")


def _prefill_primitive(e: Any) -> str:
    """`add_sequence`'s prefill (no scheduler: never chunked)."""
    n, computed, cached = e.facts
    return (f"seq {e.seq_id}: prefill of {plural(n, 'prompt token')}, {computed} computed"
            + (f", {cached} from the prefix cache" if cached else ""))


def _preempt(e: Any) -> str:
    rid, seqs, swapped, fallback = e.facts
    if swapped is not None:
        how = f"swap ({plural(swapped, 'block')} to CPU)"
    else:
        how = "recompute" + (" (CPU swap space full)" if fallback else "")
    return (f"out of blocks: request {rid} (seq {', '.join(str(s) for s in seqs)}) "
            f"preempted by {how}")


def _tokens(e: Any) -> str:
    return " ".join((e.names or repr)(t) for t in e.token_ids)


def _draft(e: Any) -> str:
    k, start = len(e.token_ids), e.facts[0]
    where = f" in new {blocks_str(e.block_ids)}" if e.block_ids else ""
    return (f"seq {e.seq_id} drafts {plural(k, 'token')} by prompt lookup ({_tokens(e)}): slots "
            f"for positions {start}–{start + k - 1} reserved{where}, not hashed until verified")


def _reject(e: Any) -> str:
    accepted, k = e.facts
    freed = f"; {blocks_str(e.block_ids)} back in the free queue" if e.block_ids else ""
    return (f"seq {e.seq_id}: the model kept {accepted} of {k} draft tokens; "
            f"{plural(len(e.token_ids), 'slot')} rolled back ({_tokens(e)}){freed}")


def _drop(e: Any) -> str:
    group, window, first, cached, kept = e.facts
    last = first + len(e.block_ids) - 1
    which = f"logical block {first}" if first == last else f"logical blocks {first}–{last}"
    text = (f"seq {e.seq_id}'s {group} layers see only the last {plural(window, 'token')}: "
            f"{which} left the window, {blocks_str(e.block_ids)} dropped from the table")
    if cached:
        text += f" ({blocks_str(cached)} {'stays' if len(cached) == 1 else 'stay'} cached)"
    if kept:
        text += f"; {blocks_str(kept)} still used by others"
    return text


_SENTENCES: dict[str, Callable[[Any], str]] = {
    "drop": _drop,
    "draft": _draft,
    "draft_kept": lambda e: (f"seq {e.seq_id}: the model confirmed all {len(e.token_ids)} draft "
                             f"tokens ({_tokens(e)}) and picked one more"),
    "reject": _reject,
    "offload": lambda e: (f"block {e.block_ids[0]}'s K/V (hash {e.facts[1]:04x}…) copied to CPU "
                          f"tier slot {e.facts[0]} before its reuse"),
    "load": lambda e: (f"seq {e.seq_id}: {plural(len(e.block_ids), 'prompt block')} found in the "
                       f"CPU tier, copied back into {blocks_str(e.block_ids)}: "
                       f"{e.facts[1]} tokens need no compute"),
    "prefix_hit": lambda e: (f"seq {e.seq_id}: prefix cache hit on {blocks_str(e.block_ids)}: "
                             f"{e.facts[0]} of {e.facts[1]} prompt tokens need no compute"),
    "share": lambda e: (f"seq {e.seq_id} shares {blocks_str(e.block_ids)} with live sequences "
                        f"(ref count + 1)"),
    "fork": lambda e: (f"seq {e.facts[0]} forked into seq {e.seq_id}: {blocks_str(e.block_ids)} "
                       f"now shared (ref count + 1), nothing copied"),
    "free": _free,
    "free_swapped": lambda e: (f"seq {e.seq_id} freed while swapped out: CPU "
                               f"{blocks_str(e.block_ids)} back in swap space"),
    "swap_out": _swap,
    "swap_in": _swap,
    "allocate": lambda e: f"seq {e.seq_id} got a new block {e.block_ids[0]}",
    "allocate_many": lambda e: (f"seq {e.seq_id} got {blocks_str(e.block_ids)} "
                                f"for {plural(e.facts[0], 'token')}"),
    "append": _append,
    "evict": lambda e: (f"block {e.block_ids[0]} evicted from the prefix cache (least recently "
                        f"used) and reused by seq {e.seq_id}"),
    "cow": lambda e: (f"seq {e.seq_id} writes into block {e.block_ids[0]}, shared by "
                      f"{e.facts[0]} sequences → copy-on-write: block {e.block_ids[0]} copied "
                      f"to block {e.block_ids[1]}"),
    "cache": lambda e: (f"block {e.block_ids[0]} is full: hashed ({e.facts[0]:04x}…) into the "
                        f"prefix cache"),
    "prefill": _prefill,
    "prefill_primitive": _prefill_primitive,
    "decode": lambda e: (f"decode: {plural(len(e.block_ids), 'sequence')} computed one token"
                         + (" each" if len(e.block_ids) != 1 else "")),
    "decode_primitive": lambda e: (f"seq {e.seq_id}: the model computed {plural(e.facts[0], 'token')}; "
                                   f"next token {_token(e)} waits as pending"),
    "preempt": _preempt,
    "finish": lambda e: f"request {e.facts[0]} finished ({e.facts[1]})",
    "abort": lambda e: (f"request {e.facts[0]} aborted: it needs more blocks than the pool has "
                        f"({e.facts[1]}); use a larger pool or fewer tokens"),
}
