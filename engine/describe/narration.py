"""The one-line sentence of an event, `narrate(event)`, written when a view asks for it.

An event keeps ids and numbers only (`engine.core.events.Event`); its sentence is written here
when a view reads it. A serving step at scale makes thousands of events a second that no view
reads, so building their text (and decoding their tokens) eagerly is wasted host time.

Each sentence is a function of one event: its ids, its `facts` (by name: what the sentence needs
besides the ids, captured when the event happened, since the pool changes after) and, for the
sentences that name a token, its `names` (how a token is shown to a person).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core.events import Event
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


def narrate(e: Event) -> str:
    """The sentence of one event: its form's if it has one, else its kind's."""
    return _SENTENCES[e.form or e.kind](e)


def logged(e: Event) -> str:
    """The event as a log line: "[step N] its sentence"."""
    return f"[step {e.step}] {narrate(e)}"


def _token(e: Event) -> str:
    tok = e.token_ids[0]
    return (e.names or repr)(tok)


def _append(e: Event) -> str:
    what = "the token it sampled last step (still on the GPU)" if e.token_ids[0] == IN_FLIGHT \
        else _token(e)
    if len(e.block_ids) > 1:  # a hybrid model: the same slot in every KV cache group's block
        return f"seq {e.seq_id} wrote {what} into slot {e.slot} of {blocks_str(e.block_ids)}"
    return f"seq {e.seq_id} wrote {what} into slot {e.slot} of block {e.block_ids[0]}"


def _free(e: Event) -> str:
    cached, kept = e.facts.cached, e.facts.kept
    text = f"seq {e.seq_id} freed"
    if e.block_ids:
        text += f": {blocks_str(e.block_ids)} back in the pool"
        if cached:
            text += f" ({blocks_str(cached)} {'stays' if len(cached) == 1 else 'stay'} cached)"
    if kept:
        text += f"; {blocks_str(kept)} still used by others (ref count - 1)"
    return text


def _swap(e: Event) -> str:
    pairs = zip(e.block_ids[::2], e.block_ids[1::2], strict=True)
    seqs = ", ".join(str(s) for s in e.facts.seqs)
    if e.kind == "swap_out":
        return f"swapped out seq {seqs}: " + ", ".join(f"{g}→cpu {c}" for g, c in pairs)
    return f"swapped in seq {seqs}: " + ", ".join(f"cpu {c}→{g}" for c, g in pairs)


def _prefill(e: Event) -> str:
    """A serving step's prefill: whole, or which chunk of a chunked prompt."""
    f = e.facts
    what = "recompute after preemption" if f.resumed else "prefill"
    if f.whole:
        return (f"seq {e.seq_id}: {what} of {plural(f.num_tokens, 'token')}, {f.computed} "
                f"computed, {f.cached} from the prefix cache")
    left = "the last chunk" if f.final else f"{f.rest} to go"
    from_cache = f" ({f.cached} from the prefix cache)" if f.cached else ""
    return (f"seq {e.seq_id}: chunked {what}: tokens {f.start}–{f.num_tokens - 1} of "
            f"{f.num_tokens + f.rest} computed{from_cache}, {left}")


def _prefill_primitive(e: Event) -> str:
    """`add_sequence`'s prefill (no scheduler: never chunked)."""
    f = e.facts
    return (f"seq {e.seq_id}: prefill of {plural(f.num_tokens, 'prompt token')}, {f.computed} "
            f"computed" + (f", {f.cached} from the prefix cache" if f.cached else ""))


def _preempt(e: Event) -> str:
    f = e.facts
    if f.swapped_blocks is not None:
        how = f"swap ({plural(f.swapped_blocks, 'block')} to CPU)"
    else:
        how = "recompute" + (" (CPU swap space full)" if f.fallback else "")
    return (f"out of blocks: request {f.request_id} (seq {', '.join(str(s) for s in f.seqs)}) "
            f"preempted by {how}")


def _tokens(e: Event) -> str:
    return " ".join((e.names or repr)(t) for t in e.token_ids)


def _draft(e: Event) -> str:
    k, start = len(e.token_ids), e.facts.start
    where = f" in new {blocks_str(e.block_ids)}" if e.block_ids else ""
    return (f"seq {e.seq_id} drafts {plural(k, 'token')} by prompt lookup ({_tokens(e)}): slots "
            f"for positions {start}–{start + k - 1} reserved{where}, not hashed until verified")


def _reject(e: Event) -> str:
    accepted, k = e.facts.accepted, e.facts.drafted
    freed = f"; {blocks_str(e.block_ids)} back in the free queue" if e.block_ids else ""
    return (f"seq {e.seq_id}: the model kept {accepted} of {k} draft tokens; "
            f"{plural(len(e.token_ids), 'slot')} rolled back ({_tokens(e)}){freed}")


def _drop(e: Event) -> str:
    f = e.facts
    group, window, first, cached, kept = f.group, f.window, f.first, f.cached, f.kept
    last = first + len(e.block_ids) - 1
    which = f"logical block {first}" if first == last else f"logical blocks {first}–{last}"
    text = (f"seq {e.seq_id}'s {group} layers see only the last {plural(window, 'token')}: "
            f"{which} left the window, {blocks_str(e.block_ids)} dropped from the table")
    if cached:
        text += f" ({blocks_str(cached)} {'stays' if len(cached) == 1 else 'stay'} cached)"
    if kept:
        text += f"; {blocks_str(kept)} still used by others"
    return text


_SENTENCES: dict[str, Callable[[Event], str]] = {
    "drop": _drop,
    "draft": _draft,
    "draft_kept": lambda e: (f"seq {e.seq_id}: the model confirmed all {len(e.token_ids)} draft "
                             f"tokens ({_tokens(e)}) and picked one more"),
    "reject": _reject,
    "offload": lambda e: (f"block {e.block_ids[0]}'s K/V (hash {e.facts.hash16:04x}…) copied to "
                          f"CPU tier slot {e.facts.slot} "
                          + ("before its reuse" if e.facts.evicted else "once computed")),
    "load": lambda e: (f"seq {e.seq_id}: {plural(len(e.block_ids), 'prompt block')} found in the "
                       f"CPU tier, copied back into {blocks_str(e.block_ids)}: "
                       f"{e.facts.tokens} tokens need no compute"),
    "prefix_hit": lambda e: (f"seq {e.seq_id}: prefix cache hit on {blocks_str(e.block_ids)}: "
                             f"{e.facts.hit_tokens} of {e.facts.prompt_tokens} prompt tokens need "
                             f"no compute"),
    "share": lambda e: (f"seq {e.seq_id} shares {blocks_str(e.block_ids)} with live sequences "
                        f"(ref count + 1)"),
    "fork": lambda e: (f"seq {e.facts.parent} forked into seq {e.seq_id}: {blocks_str(e.block_ids)} "
                       f"now shared (ref count + 1), nothing copied"),
    "free": _free,
    "free_swapped": lambda e: (f"seq {e.seq_id} freed while swapped out: CPU "
                               f"{blocks_str(e.block_ids)} back in swap space"),
    "swap_out": _swap,
    "swap_in": _swap,
    "allocate": lambda e: f"seq {e.seq_id} got a new block {e.block_ids[0]}",
    "allocate_many": lambda e: (f"seq {e.seq_id} got {blocks_str(e.block_ids)} "
                                f"for {plural(e.facts.tokens, 'token')}"),
    "append": _append,
    "evict": lambda e: (f"block {e.block_ids[0]} evicted from the prefix cache (least recently "
                        f"used) and reused by seq {e.seq_id}"),
    "cow": lambda e: (f"seq {e.seq_id} writes into block {e.block_ids[0]}, shared by "
                      f"{e.facts.shared_by} sequences → copy-on-write: block {e.block_ids[0]} copied "
                      f"to block {e.block_ids[1]}"),
    "cache": lambda e: (f"block {e.block_ids[0]} is full: hashed ({e.facts.hash16:04x}…) into the "
                        f"prefix cache"),
    "prefill": _prefill,
    "prefill_primitive": _prefill_primitive,
    "decode": lambda e: (f"decode: {plural(len(e.block_ids), 'sequence')} computed one token"
                         + (" each" if len(e.block_ids) != 1 else "")),
    "decode_primitive": lambda e: (f"seq {e.seq_id}: the model computed "
                                   f"{plural(e.facts.tokens, 'token')}; "
                                   f"next token {_token(e)} waits as pending"),
    "preempt": _preempt,
    "finish": lambda e: f"request {e.facts.request_id} finished ({e.facts.reason})",
    "abort": lambda e: (f"request {e.facts.request_id} aborted: it needs more blocks than the "
                        f"pool has ({e.facts.pool_blocks}); use a larger pool or fewer tokens"),
}
