"""The shards picture and the app's tensor-parallel setting, without starting workers (the
figures of a live tensor-parallel engine are checked in tests/engine/tp/test_tensor_parallel.py)."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest

from engine import EngineConfig, LLMEngine
from ui import tp_panel
from ui.limits import UserError
from viz.shards_figure import shards_figure


def _info(n: int, per_block: int, num_blocks: int) -> dict:
    # the keys a tensor-parallel engine_info() carries (tests/engine/tp/test_tensor_parallel.py checks them)
    return {"tensor_parallel_size": n, "kv_bytes_per_rank": [per_block * num_blocks] * n,
            "kv heads per rank": 1, "kv bytes per block per rank": per_block}


def test_one_table_and_n_pools_with_the_same_block_ids():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=12))
    a = eng.add_sequence("abcdefghij")
    eng.append(eng.fork(a), token_ids=[120])
    snap = eng.snapshot()
    fig = shards_figure(snap, _info(3, 2048, 12))
    go.Figure(json.loads(fig.to_json()))  # built unvalidated: valid plotly all the same
    pools = [t for t in fig.data if t.name.startswith("rank")]
    assert [t.name for t in pools] == ["rank 0", "rank 1", "rank 2"]
    for t in pools:  # every rank draws every block, with the same ids and colours
        assert list(t.text) == [str(i) for i in range(12)]
        assert list(t.marker.color) == list(pools[0].marker.color)
    tables = next(t for t in fig.data if t.name == "block tables")
    assert list(tables.text) == [str(b) for s in sorted(snap.sequences) for b in
                                 snap.sequences[s].block_table]
    notes = " ".join(a.text for a in fig.layout.annotations)
    assert "rank 2</b>: KV head 2" in notes and "24.0 KiB of KV" in notes


def test_the_tensor_parallel_setting_is_checked():
    real = EngineConfig(model="default", block_size=16, num_gpu_blocks=64)
    assert tp_panel.with_tp(real, 3).tensor_parallel_size == 3
    assert tp_panel.with_tp(real, 1) is real
    with pytest.raises(UserError, match="dry mode"):
        tp_panel.with_tp(EngineConfig(model=None, num_gpu_blocks=8), 3)
    with pytest.raises(UserError, match="tensor parallel size"):
        tp_panel.with_tp(real, 8)


def test_the_shards_plot_hides_without_tensor_parallelism_and_ranks_are_checked():
    from ui.session import Session

    s = Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=8))
    assert tp_panel.shards_update(s)["visible"] is False
    assert tp_panel.rank_of(None, s) is None and tp_panel.rank_of(0, s) == 0
    with pytest.raises(UserError, match="rank"):
        tp_panel.rank_of(1, s)  # one process: rank 0 only
