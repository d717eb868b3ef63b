"""Running a batch through the model with paged attention: the attention plug-in and its metadata.

How a step works. The scheduler hands over a mixed batch of sequences (prefills with q_len new
tokens, decodes with one), each with its block table. We pack every new token of every sequence
into one row (`input_ids [1, total_tokens]`, `position_ids [1, total_tokens]`), so there is no
padding at all, and run the HF model once with `past_key_values=None, use_cache=False`: the model
keeps no cache of its own, ours is the only one.

The attention of every layer is "pagedlab" (attention_plugin.py): it writes the new tokens'
K/V into their slots of the paged pool and attends each new query to its sequence's context
read through the block table of the layer's KV cache group (a hybrid model has one table per
group: engine/runtime/kv_layout.py). This file builds that per-step metadata.

Two ways through the layers, same inputs, same pool, same answer (tests hold them equal):
Llama-family models run on the lean decoder (lean_decoder.py: fused layer kernels over the
model's own weights, nine launches a layer instead of about forty); any other architecture, and
tools that hook the modules (`module_path()`), run the modules above. Pure-decode steps go
through static buffers and, on a GPU, CUDA graphs (decode_graphs.py).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from engine.runtime.attention_plugin import METADATA_KWARG, PagedMetadata, use_paged_attention
from engine.runtime.cache_engine import CacheEngine
from engine.runtime.decode_graphs import DecodeGraphs, DecodeStep
from engine.runtime.lean_decoder import lean_forward
from engine.runtime.prefill_graphs import PrefillGraphs
from engine.runtime.protocols import StepItem
from engine.runtime.sampler import TorchScores, fused_sampling_available
from engine.runtime.sampler_workspace import SamplerWorkspace
from engine.runtime.step_inputs import StepInputs
from engine.runtime.transfer import to_device
from paged_kernels.attention_config import query_tile

#: on a GPU, a prompt's rest of at most this many tokens (after a prefix hit, a load from the CPU
#: tier, a chunk's end) runs in the step's graph beside the decodes instead of a step of eager
#: launches: for a small model those launches cost ten times the GPU's work
SHORT_PREFILL = 8

#: async scheduling: ([(index in the batch, row)], tokens): that sequence's one new token is
#: tokens[row] on the device (the last step's pick, not read back yet)
Feed = tuple[list[tuple[int, int]], torch.Tensor]


class ModelRunner:
    """Runs batches of scheduled sequences through the model, reading and writing the paged pool."""

    def __init__(self, loaded_model: Any, cache_engine: CacheEngine, max_batch: int = 256,
                 use_graphs: bool | None = None, use_lean: bool = True, max_query: int = 1,
                 static_queries: bool = False, prefill_tokens: int | None = None) -> None:
        self.loaded = loaded_model
        self.model = loaded_model.model
        self.cache = cache_engine
        self.device = cache_engine.device
        self.block_size = cache_engine.block_size
        self.max_model_len = int(loaded_model.max_position_embeddings)
        if cache_engine.dtype != loaded_model.dtype:
            raise ValueError(f"the KV pool is {cache_engine.dtype} but the model computes in "
                             f"{loaded_model.dtype}: they must match")
        use_paged_attention(self.model)
        # The decoder stack without the LM head: logits are computed for the last token of each
        # sequence only, not for every token of a long prompt.
        self.decoder = self.model.base_model
        self.lm_head = self.model.get_output_embeddings()
        self.num_tokens_computed = 0  # every token ever run through the model
        self.num_forward_passes = 0
        # A ready-made 4-d mask makes transformers skip its own mask building (which would read
        # position ids back from the device to detect packed sequences): our kernels ignore masks.
        self._no_mask = torch.zeros((1, 1, 1, 1), dtype=cache_engine.dtype, device=self.device)
        self._query_starts = torch.arange(max_batch + 1, dtype=torch.int32, device=self.device)
        max_len = min(self.max_model_len, cache_engine.num_gpu_blocks * self.block_size)
        self.layout = cache_engine.layout  # which group's table and which page slot each layer reads
        self.inputs = StepInputs(self.block_size, self.layout, self.max_model_len,
                                 cache_engine.num_gpu_blocks)
        # Steps run on the lean decoder (fused layer kernels) where the architecture allows,
        # else on the model's own modules with our attention plugged in.
        self.lean = getattr(loaded_model, "lean", None) if use_lean else None
        self._modules_only = 0
        # the lean decoder waits before each layer part for a load from the CPU tier (graphs
        # capture the waits): engine/runtime/tier_copies.py
        tier = cache_engine.tier
        self._layer_waits = None if tier is None else tier.layer_waits(self.layout.layer_slot)
        # the sampler's full-vocabulary scratch, reused every step (fresh pages cost a CPU more
        # than the arithmetic on them)
        self.sampler_workspace = SamplerWorkspace()
        # decodes, and steps of up to max_query tokens a sequence (drafts to verify, short rests
        # of prompts), from static buffers; on a CPU only decodes unless `static_queries`
        graphs_on = cache_engine.device.type == "cuda" if use_graphs is None else use_graphs
        if graphs_on:
            max_query = max(max_query, SHORT_PREFILL)
        self.static_queries = static_queries
        self.graphs = DecodeGraphs(self._decode_forward, self.device, max_batch,
                                   -(-max_len // self.block_size), max_len, use_graphs,
                                   num_groups=self.layout.num_groups, block_size=self.block_size,
                                   max_query=max_query)
        # steps with longer chunks of prompts, up to `prefill_tokens` tokens, from static
        # buffers too (graphs where the decodes' are): the lean decoder only
        self.prefill = None
        if prefill_tokens and self.lean is not None:
            lean = self.lean
            group = lean.num_q_heads // lean.num_kv_heads
            self.prefill = PrefillGraphs(
                self._prefill_forward, self.device, prefill_tokens, max_batch, self.graphs.width,
                self.layout.num_groups,
                lambda t: query_tile(t, group, lean.head_dim, self.block_size), use_graphs)

    def close(self) -> None:
        """Let go of this runner's own tensors now: decode graphs, static buffers, the sampler's
        workspace (idempotent). The KV pool is the cache engine's (`CacheEngine.close`); the
        model's weights are shared and stay."""
        self.graphs.close()
        if self.prefill is not None:
            self.prefill.close()
        self.sampler_workspace.release()
        self._no_mask = self._query_starts = None

    @torch.inference_mode()
    def execute(self, batch: list[StepItem], feed: Feed | None = None) -> torch.Tensor:
        """One forward pass over the batch: float32 logits [rows, vocab] of each sequence's last
        new token (its last num_logits tokens'), in batch order. New tokens' K/V are written into
        their slots."""
        if not batch:
            raise ValueError("execute() needs at least one scheduled sequence")
        meta, input_ids, positions, last_rows = self.prepare(batch, feed is not None)
        if feed is not None:  # a fed sequence's one new token is its last row's
            _feed_into(input_ids[0], last_rows, feed)
        if any(s.num_logits > 1 for s in batch):  # a draft's verification: a row per position
            ends = itertools.accumulate(len(s.token_ids) for s in batch)
            last_rows = torch.tensor([r for s, e in zip(batch, ends, strict=True)
                                      for r in range(e - s.num_logits, e)]).to(last_rows.device)
        if self.lean is not None and not self._modules_only:
            logits = lean_forward(self.lean, meta, input_ids[0], positions[0],
                                  last_rows=last_rows).float()
        else:
            out = self.decoder(
                input_ids=input_ids, position_ids=positions, attention_mask=self._no_mask,
                past_key_values=None, use_cache=False, **{METADATA_KWARG: meta},
            )
            logits = self.lm_head(out.last_hidden_state[0, last_rows]).float()
        self.num_tokens_computed += int(input_ids.shape[1])
        self.num_forward_passes += 1
        return logits

    def warm_up(self, log: Callable[[str], None] | None = None) -> float:
        """Compile the kernels and capture every decode graph now, at engine start, so that the
        first user's steps are not the ones that pay for it (on a GPU; nothing to do on a CPU).
        Writes scratch K/V into the first blocks of the pool, which hold nothing yet. Returns
        the seconds it took."""
        if not self.graphs.use_graphs:
            return 0.0
        start = time.perf_counter()
        bs = self.block_size
        nblocks = self.cache.num_gpu_blocks
        # a few prefill shapes, mixed with decodes: the Triton kernels compile once per
        # specialisation (lengths divisible by 16 or not, one sequence or several), and the
        # last is a chunk of a long prompt after its first blocks (chunked prefill), as big as
        # a step gets, so that the allocator has grown to it too
        big = max(16, min(2048, nblocks * bs // 2) // 16 * 16 - 2 * bs - 15)
        for lens, done in (([17], [0]), ([16, 33, 1, 1], [0] * 4), ([bs * 4 + 3, 1], [0, 0]),
                           ([big] + [1] * 15, [2 * bs] + [bs - 1] * 15)):
            need = [-(-(n + c) // bs) for n, c in zip(lens, done, strict=True)]
            groups = self.layout.num_groups  # a table of its own blocks in every KV cache group
            if sum(need) * groups > nblocks:
                continue
            first = [sum(need[:i]) * groups for i in range(len(lens))]
            self.execute([StepItem([0] * n, c, list(range(f, f + k)), 1, tuple(
                list(range(f + g * k, f + (g + 1) * k)) for g in range(1, groups)))
                for n, c, f, k in zip(lens, done, first, need, strict=True)])

        def progress(done: int, total: int) -> None:
            if log is not None and (done % 5 == 0 or done == total - 1):
                log(f"[pagedlab] capturing decode graphs: {done + 1}/{total} batch sizes")

        if fused_sampling_available(self.device):  # the sampling kernel's variants, too
            from paged_kernels import sampling

            sampling.warm_up(int(self.lm_head.weight.shape[0]), self.device)
        queries = (1, self.graphs.max_query) if self.graphs.max_query > 1 else (1,)
        self.graphs.capture(queries=queries, progress=progress)
        if self.prefill is not None:
            self.prefill.capture()
        torch.cuda.synchronize(self.device)
        self.num_tokens_computed = self.num_forward_passes = 0  # scratch work: not the user's
        seconds = time.perf_counter() - start
        if log is not None:
            chunks = 0 if self.prefill is None else len(self.prefill.graphs)
            log(f"[pagedlab] engine warm: kernels compiled, {len(self.graphs.graphs)} decode "
                f"and {chunks} prefill graphs captured in {seconds:.1f} s")
        return seconds

    @contextmanager
    def module_path(self) -> Iterator[None]:
        """Run every step through the model's own modules, eagerly, while inside: for tools
        that hook the modules (the lesson's attention probe), which a graph replay or the lean
        decoder would bypass."""
        self._modules_only += 1
        try:
            yield
        finally:
            self._modules_only -= 1

    @property
    def waits_by_layer(self) -> bool:
        """Whether the next pass waits for loads from the CPU tier layer part by layer part
        (the lean decoder does, the model's own modules do not)."""
        return self._layer_waits is not None and self.lean is not None and not self._modules_only

    def execute_scores(self, batch: list[StepItem], feed: Feed | None = None) -> TorchScores:
        """The step's scores. Through the static path (CUDA graphs on a GPU): a batch of decodes,
        and on a GPU (or with `static_queries`) any batch whose sequences compute at most
        `max_query` tokens each: decodes with drafts to verify, the short rest of a prompt after
        a prefix hit or a load from the CPU tier, beside decodes. Anything else (longer
        prefills; on a CPU, drafts too: no padding to pay for there) through `execute`."""
        if not self._modules_only:
            q = max(len(s.token_ids) for s in batch)
            padded = self.graphs.use_graphs or self.static_queries
            if 1 < q <= self.graphs.max_query and padded:
                q = self.graphs.max_query  # one graph a bucket: every short row padded to it
            width = max((len(s.block_table) for s in batch), default=0)  # groups: as long
            if (q == 1 or (q == self.graphs.max_query and padded)) and \
                    self.graphs.fits(len(batch), width, q):
                return self.decode(batch, feed, q)
            if self.prefill is not None:
                logits = self._prefill_step(batch, feed)
                if logits is not None:
                    return TorchScores(logits, workspace=self.sampler_workspace)
        return TorchScores(self.execute(batch, feed), workspace=self.sampler_workspace)

    def _prefill_step(self, batch: list[StepItem], feed: Feed | None) -> torch.Tensor | None:
        """A step through the prefill buffers (prefill_graphs.py): logits of each sequence's
        last token; None where it does not fit them (drafts to verify, too many tokens)."""
        if any(s.num_logits != 1 for s in batch):
            return None
        tokens = sum(len(s.token_ids) for s in batch)
        width = max(len(t) for s in batch for t in s.tables())
        size = self.prefill.bucket(tokens, len(batch), width)
        if size is None:
            return None
        step = self.inputs.host(batch, feed is not None)
        fill = None
        if feed is not None:  # a fed sequence's token is its last row's
            last = step.query_start[1:] - 1
            fed = ([(int(last[i]), row) for i, row in feed[0]], feed[1])
            fill = lambda ids: _feed_into(ids, None, fed)  # noqa: E731
        logits = self.prefill.run(step, size, fill)
        self.num_tokens_computed += tokens
        self.num_forward_passes += 1
        return logits

    def _prefill_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                         slots: torch.Tensor, tables: torch.Tensor, seq_lens: torch.Tensor,
                         query_starts: torch.Tensor, last_rows: torch.Tensor,
                         tile_map: torch.Tensor, size: int) -> torch.Tensor:
        """Decoder + LM head over a prefill bucket of `size` tokens: what the prefill graphs
        capture. `slots` [groups, size] and `tables` [groups, S, W]."""
        meta = PagedMetadata(
            kv_cache=self.cache.kv_cache, ops=self.cache.ops, slot_mappings=tuple(slots.unbind(0)),
            block_tables=tuple(tables.unbind(0)), seq_lens=seq_lens, query_start_loc=query_starts,
            max_query_len=size, max_seq_len=self.graphs.max_seq_len, layout=self.layout,
            tile_map=tile_map, layer_waits=self._layer_waits,
        )
        return lean_forward(self.lean, meta, input_ids, positions, last_rows=last_rows)

    def decode(self, batch: list[StepItem], feed: Feed | None = None, q: int = 1) -> TorchScores:
        """Every sequence's new tokens (a decode token, then up to q - 1 draft tokens) from the
        static buffers (see decode_graphs.py): q logits rows a sequence, the draft padded."""
        if not batch:
            raise ValueError("decode() needs at least one scheduled sequence")
        bs, limit = self.block_size, self.max_model_len
        windows = self.layout.windows
        # Comprehensions, not a loop: this runs for every sequence of every step. Anything
        # unusual goes through the full check, which says what is wrong.
        positions = [s.num_computed for s in batch]
        lengths = [len(s.token_ids) for s in batch]
        firsts = [s.block_table for s in batch]
        others = [s.group_tables for s in batch]
        last_block = (np.add(positions, lengths) - 1) // bs  # each row's last token's block
        if (min(positions) < 0 or min(lengths) < 1 or max(lengths) > q
                or max(map(int.__add__, positions, lengths)) > limit
                or (np.fromiter(map(len, firsts), np.int64, len(batch)) <= last_block).any()
                or min(map(len, others)) != len(windows) - 1
                or max(map(len, others)) != len(windows) - 1):
            for i, seq in enumerate(batch):
                self.inputs.check(i, seq)
        if any(windows):
            for i, seq in enumerate(batch):
                self.inputs.check_windows(i, seq)
        if q == 1:
            tokens = [s.token_ids[0] for s in batch]
            drafts = [0] * len(batch)
        else:
            tokens = [t for s in batch for t in s.token_ids + [0] * (q - len(s.token_ids))]
            drafts = [n - 1 for n in lengths]
        keys = [s.key for s in batch]
        fed = fill = None
        if feed is not None:  # placeholders in the buffer, the fed tokens read on the device:
            if self.graphs.can_feed(len(feed[1])):  # inside the graph, from the step's buffer
                fed = [-1] * len(batch)
            else:  # picks of a step larger than the graphs' buckets: written in before the replay
                fill = lambda ids: _feed_into(ids[:, 0], None, feed)  # noqa: E731
            for i, row in feed[0]:
                tokens[i * q] = 0
                if fed is not None:
                    fed[i] = row
        tables = [firsts]
        tables += [[t[g] for t in others] for g in range(len(windows) - 1)]
        step = DecodeStep(tokens, positions, drafts, keys, tables, q, fed)
        out = self.graphs.run(step, num_blocks=self.cache.num_gpu_blocks, feed=fill,
                              picks=None if fed is None else feed[1])
        if out is None:  # a block id outside the pool: find it and say which
            for i, seq in enumerate(batch):
                self.inputs.check(i, seq)
        self.num_tokens_computed += sum(lengths)
        self.num_forward_passes += 1
        greedy = None if out.greedy_ids is None else (out.greedy_ids, out.greedy_logprobs)
        rows = None if q == 1 else [i * q + j for i, s in enumerate(batch)
                                    for j in range(len(s.token_ids) - s.num_logits, len(s.token_ids))]
        return TorchScores(out.logits, None, greedy, workspace=self.sampler_workspace, rows=rows,
                           accepted=out.accepted)

    def _decode_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                        slots: torch.Tensor, seq_lens: torch.Tensor, tables: torch.Tensor,
                        max_seq_len: int, q: int = 1) -> torch.Tensor:
        """Decoder + LM head for q tokens per sequence: what the decode graphs capture. `slots`
        [groups, B x q] and `tables` [groups, B, W]: one row per KV cache group. No host reads
        in here (a capture would fail on one)."""
        num_seqs = tables.shape[1]
        query_starts = self._query_starts[: num_seqs + 1]
        if q > 1:
            query_starts = query_starts * q
        meta = PagedMetadata(
            kv_cache=self.cache.kv_cache, ops=self.cache.ops, slot_mappings=tuple(slots.unbind(0)),
            block_tables=tuple(tables.unbind(0)), seq_lens=seq_lens, query_start_loc=query_starts,
            max_query_len=q, max_seq_len=max_seq_len, layout=self.layout,
            layer_waits=self._layer_waits,
        )
        if self.lean is not None:
            return lean_forward(self.lean, meta, input_ids, positions)
        out = self.decoder(
            input_ids=input_ids[None], position_ids=positions[None], attention_mask=self._no_mask,
            past_key_values=None, use_cache=False, **{METADATA_KWARG: meta},
        )
        return self.lm_head(out.last_hidden_state[0])

    def prepare(self, batch: list[StepItem], fed: bool = False
                ) -> tuple[PagedMetadata, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Metadata and packed inputs of a batch (step_inputs.py), moved to the device once."""
        x, dev = self.inputs.host(batch, fed), self.device
        meta = PagedMetadata(
            kv_cache=self.cache.kv_cache,
            ops=self.cache.ops,
            slot_mappings=tuple(to_device(s, torch.long, dev) for s in x.slots),
            block_tables=tuple(to_device(t, torch.int32, dev) for t in x.tables),
            seq_lens=to_device(x.seq_lens, torch.int32, dev),
            query_start_loc=to_device(x.query_start, torch.int32, dev),
            max_query_len=int(np.diff(x.query_start).max()),
            max_seq_len=int(x.seq_lens.max()),
            layout=self.layout,
            layer_waits=self._layer_waits,
        )
        last_rows = to_device(x.query_start[1:] - 1, torch.long, dev)
        input_ids, token_positions = (to_device(a[None], torch.long, dev) for a in (x.ids, x.positions))
        return meta, input_ids, token_positions, last_rows

def _feed_into(input_ids: torch.Tensor, rows: torch.Tensor | None, feed: Feed) -> None:
    """Write each fed sequence's token, read on the device from the last step's picks, into
    its place among the step's input ids (rows[i]: item i's place; None: place i)."""
    pairs, tokens = feed
    dev = input_ids.device
    items = to_device([i for i, _ in pairs], torch.long, dev)
    where = items if rows is None else rows.index_select(0, items)
    picked = tokens.index_select(0, to_device([r for _, r in pairs], torch.long, dev))
    input_ids.index_copy_(0, where, picked.to(input_ids.dtype))
