"""The written contracts between the engine and what runs its model: the runtime, the scores a
forward pass returns, and the picks a step leaves on the device.

LLMEngine drives one of three runtimes and never asks which: `runtime.Runtime` (one process,
real tensors), `tp.runtime.TPRuntime` (N worker processes, tensor parallelism) and
`dry.dry_runtime.DryRuntime` (the dry mode: no model, a seeded RNG). Each forward pass comes back
as scores: `sampler.TorchScores`, `tp.runtime.RemoteScores` or `dry.dry_model.DryScores`.
Every one of them implements the whole contract below; what one cannot do is said by a
property (`can_overlap`, `has_argmax`, `can_save_blocks`), not by a missing method.

This module imports no torch (and nothing else of the engine), so the torch-free engine can
name these types. Tensors appear as `Any`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable


class StepItem(NamedTuple):
    """One sequence's part of a forward pass, the same for every runtime (a NamedTuple: one is
    made per sequence per step)."""

    token_ids: Sequence[int]  # the new tokens to compute (q_len >= 1)
    num_computed: int  # tokens whose K/V are already in the cache (= position of the first new one)
    block_table: Sequence[int | None]  # the first KV cache group's table, holding all of them
    num_logits: int = 1  # rows of logits: of the last new token, or of the last k + 1 (drafts)
    # the tables of the KV cache groups after the first (hybrid models), None where a
    # sliding-window group dropped a block (the first table may hold None too: all-sliding)
    group_tables: Sequence[Sequence[int | None]] = ()
    key: Any = None  # names the sequence from step to step (its decode row stays on the device)

    def tables(self) -> tuple[Sequence[int | None], ...]:
        return (self.block_table, *self.group_tables)


#: Async scheduling: ([(index in the batch, row)], tokens). The item's one new token is not on
#: the host yet: it is tokens[row], a device tensor the last step's picks left (`Picks.tokens`).
Feed = tuple[list[tuple[int, int]], Any]

#: (token id, its log probability under the model)
TokenLogprob = tuple[int, float]


class SampleRequestLike(Protocol):
    """What a draw needs of a request (engine.core.sampler_keys.SampleRequest)."""

    row: int
    params: Any  # SamplingParams: temperature, top_p, top_k
    u: float  # the request's uniform number for this draw


@runtime_checkable
class Picks(Protocol):
    """A step's picks: `result()` gives (token, log prob) for each request `pick_rows` got, in
    order; `tokens` is the device tensor [rows] the next step's inputs read the picks from
    (None where the picks never were on a device)."""

    tokens: Any

    def result(self) -> list[TokenLogprob]: ...


class HostPicks:
    """Picks that are on the host already (drawn now, read when the step lands): what scores
    hand back from `pick_rows` when their picks never were on a device (the dry mode, and
    tensor parallelism, whose picks come back over the wire)."""

    tokens = None

    def __init__(self, picks: list[TokenLogprob]) -> None:
        self._picks = picks

    def result(self) -> list[TokenLogprob]:
        return self._picks


@runtime_checkable
class Scores(Protocol):
    """The next-token scores of one forward pass, one row per sequence that ran."""

    num_rows: int

    @property
    def can_overlap(self) -> bool:
        """Whether `pick_rows` leaves the picks where the next step can read them before the
        host does (async scheduling overlaps steps only then)."""
        ...

    @property
    def has_argmax(self) -> bool:
        """Whether a greedy row's pick is its most likely token, drawing no uniform number (a
        model's scores); False where greedy rows draw like sampled ones (the dry mode)."""
        ...

    def greedy(self, row: int) -> TokenLogprob | None:
        """The most likely next token of `row` and its log probability (None: no argmax)."""
        ...

    def sample_many(self, requests: list[Any]) -> list[TokenLogprob]:
        """One token per request (greedy or drawn at its uniform), in order."""
        ...

    def pick_rows(self, requests: list[Any]) -> Picks:
        """`sample_many`, with the reading deferred to `Picks.result()`."""
        ...

    def accepted(self, index: int) -> int | None:
        """Of a step that verifies drafts: how many draft tokens of its sequence `index` (in the
        step's order) the greedy picks confirm, as the device decided it; None where it did not."""
        ...

    def top_many(self, rows: list[int], ks: list[int]) -> list[list[TokenLogprob]]:
        """The ks[i] most likely next tokens of rows[i], best first (beam candidates)."""
        ...

    def top(self, row: int, k: int) -> list[TokenLogprob]:
        """`top_many` of one row."""
        ...


@runtime_checkable
class Tokenizer(Protocol):
    """The tokenizer calls the engine makes."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


@runtime_checkable
class ModelRuntime(Protocol):
    """What LLMEngine drives: the model, the KV pool, one forward pass a call.

    Block ids are the engine's: the runtime keeps no bookkeeping, it moves bytes where it is
    told. `close()` lets go of the KV tensors, graphs, workspaces and worker processes at once
    (idempotent); a closed runtime refuses further work with a clear error."""

    tokenizer: Tokenizer
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    num_gpu_blocks: int
    max_model_len: int
    kv_cache_groups: tuple[Any, ...]  # engine.core.kv_groups.KVCacheGroup: a table each
    num_layers: int  # layers whose K/V `read_block` reads (0: none, the dry mode)
    loaded: Any  # the model's facts: name, num_layers, num_q_heads, ...; None without a model

    def primitive_token(self, pending_token: int | None) -> int:
        """The token a primitive's decode step (`append(seq, n)`) writes into the cache: the
        model's pending pick (the dry mode, which picks none, draws one from its seeded RNG)."""
        ...

    @property
    def can_save_blocks(self) -> bool:
        """Whether `save_blocks` can save what a checkpoint needs (not where the bytes live in
        worker processes)."""
        ...

    def save_blocks(self, gpu_ids: list[int], cpu_ids: list[int]) -> Any:
        """What this runtime must restore to stand where it stands now: the K/V bytes of these
        pool and swap-space blocks (the dry mode: its RNG's state); for `load_blocks`, into a
        runtime of the same config."""
        ...

    def load_blocks(self, saved: Any) -> None: ...

    def saved_bytes(self, saved: Any) -> int:
        """The bytes `saved` holds."""
        ...

    def execute(self, items: Sequence[StepItem], feed: Feed | None = None) -> Scores:
        """One forward pass over `items` (their new tokens' K/V written into their slots):
        the scores of each item's last new token, in order. `feed` only where the last step's
        scores could overlap (`Scores.can_overlap`)."""
        ...

    def draft_cost(self, num_seqs: int, q: int) -> float:
        """What a step of num_seqs sequences of q tokens each (a decode and q - 1 draft tokens to
        verify) costs, as a multiple of a decode step of those sequences."""
        ...

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: block src -> dst for every (src, dst), every layer."""
        ...

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Device block -> CPU block for every (gpu id, cpu id)."""
        ...

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """CPU block -> device block for every (cpu id, gpu id)."""
        ...

    def offload(self, pairs: list[tuple[int, int]]) -> None:
        """Device block -> CPU tier slot for every (gpu id, slot): a cached block's K/V kept."""
        ...

    def load(self, pairs: list[tuple[int, int]]) -> None:
        """CPU tier slot -> device block for every (slot, gpu id): a prefix copied back."""
        ...

    def fetch_ahead(self, slots: list[int]) -> None:
        """Loads later in this step will read these tier slots: start moving their bytes now,
        while the bookkeeping allocates and evicts for them (a hint: `load` is still called,
        and is what counts; a slot an offload writes before its load is read again)."""
        ...

    def read_block(self, block_id: int, layer: int, rank: int | None = None
                   ) -> tuple[Any, Any]:
        """(K, V) of one block in one layer as CPU float32 tensors [block_size, kv_heads,
        head_dim]; `rank`: one tensor-parallel rank's slice (0 or None without parallelism)."""
        ...

    def kv_bytes_per_rank(self) -> list[int]:
        """The KV pool's bytes on each rank (one entry without tensor parallelism)."""
        ...

    def module_path(self) -> Any:
        """A context in which forward passes run through the model's own modules, so that hooks
        on them fire (the lessons' attention probe); a ValueError where that cannot be."""
        ...

    def info(self) -> dict[str, Any]:
        """What this runtime is, in words and numbers (the UI's Engine tab)."""
        ...

    def close(self) -> None:
        """Free the KV tensors, graphs, workspaces and workers now; idempotent."""
        ...

    @property
    def closed(self) -> bool:
        """Whether `close()` ran (or the workers were stopped)."""
        ...
