"""Where each layer's K/V live in the paged pool when a model has several KV cache groups.

The pool is one tensor of equal pages, `kv_cache[page_layers, 2, num_blocks, block_size,
kv_heads, head_dim]`: block b of the pool is the page `kv_cache[:, :, b]`, holding the K/V of
one group's layers (engine/core/kv_groups.py). Layer l of group g is slot `layer_slot[l]` of the
pages its group's block table names, so one block id means the same bytes whichever group holds
it, and a copy-on-write, a swap or a checkpoint moves whole pages by block id, whatever the group.

Why one pool of pages and not a pool per group: a hybrid model's groups need blocks in different
proportions (a long sequence holds every block in a full group, a window's worth in a sliding
one), and one pool lets either take what the other does not use, as vLLM v1's hybrid allocator
does. A page is as big as the largest group; where groups have different numbers of layers
(Qwen2's `max_window_layers`), the smaller group's pages leave their last slots unused (vLLM
splits such groups into equal ones instead; the layouts of gpt-oss and Gemma 3 are equal).

With one group (every layer full, as in the default model) slot = layer: the plain layout.
"""

from __future__ import annotations

from engine.core.kv_groups import KVCacheGroup, single_group


class KVLayout:
    """Each layer's group and page slot; `page_layers` slots a page."""

    __slots__ = ("groups", "num_layers", "layer_group", "layer_slot", "page_layers", "windows")

    def __init__(self, groups: tuple[KVCacheGroup, ...], num_layers: int) -> None:
        if len(groups) == 1 and not groups[0].layers:  # one group: every layer
            groups = (KVCacheGroup(groups[0].name, tuple(range(num_layers)), groups[0].window),)
        group_of, slot_of = [-1] * num_layers, [-1] * num_layers
        for g, group in enumerate(groups):
            for slot, layer in enumerate(group.layers):
                group_of[layer], slot_of[layer] = g, slot
        if -1 in group_of:
            raise ValueError(f"layer {group_of.index(-1)} is in no KV cache group")
        self.groups = groups
        self.num_layers = num_layers
        self.layer_group = tuple(group_of)
        self.layer_slot = tuple(slot_of)
        self.page_layers = max(len(g.layers) for g in groups)
        self.windows = tuple(g.window for g in groups)

    @classmethod
    def single(cls, num_layers: int) -> KVLayout:
        return cls(single_group(num_layers), num_layers)

    @property
    def num_groups(self) -> int:
        return len(self.groups)
