"""The prefix cache's CPU tier in the picture: a labelled band of slots under the GPU pool (and
under the swap space), grey where a slot keeps an evicted block, white where free; an offload's
arrow runs from the GPU block to its slot, a load's from the slot to the GPU block it filled."""

from __future__ import annotations

import json

import plotly.graph_objects as go

from engine import EngineConfig, LLMEngine, SamplingParams
from viz import metrics_html, pool_figure
from viz.pool_cells import CACHED, FREE

TIER_NOTE = "CPU tier of the prefix cache"


def tiered(**kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=6, num_offload_blocks=4, **kw))


def evict_into_the_tier(eng: LLMEngine) -> None:
    """Two 13-token prompts through a 6-block pool: the second evicts the first's cached blocks."""
    eng.free(eng.add_sequence(list(range(65, 78))))
    eng.add_sequence(list(range(97, 110)))


def trace(fig: go.Figure, name: str):
    return next((t for t in fig.data if t.name == name), None)


def notes(fig: go.Figure) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def tier_cells(fig: go.Figure) -> dict[int, tuple]:
    """slot -> (z, text, hover) of the tier's cells."""
    heat = trace(fig, "cpu tier")
    return {cd[0]: (heat.z[r][c], heat.text[r][c], cd[1]) for r, row in enumerate(heat.customdata)
            for c, cd in enumerate(row) if cd is not None}


def test_no_tier_no_band():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=6))
    evict_into_the_tier(eng)
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    assert trace(fig, "cpu tier") is None and not any(TIER_NOTE in n for n in notes(fig))
    assert trace(fig, "offload") is None


def test_the_tier_is_a_labelled_band_of_its_slots_after_evictions():
    eng = tiered()
    fig = pool_figure(eng.snapshot(), (), eng.decode)
    assert {s: c[:2] for s, c in tier_cells(fig).items()} == {s: (FREE, f"t{s}") for s in range(4)}
    evict_into_the_tier(eng)
    snap = eng.snapshot()
    held = [b.block_id for b in snap.tier_blocks if b.state == "cached"]
    assert held and sorted(held) == sorted(snap.tier_lru)
    fig = pool_figure(snap, eng.last_events, eng.decode)
    go.Figure(json.loads(fig.to_json()))  # built unvalidated: valid plotly all the same
    cells = tier_cells(fig)
    assert [s for s, c in cells.items() if c[0] == CACHED] == held
    assert all(cells[s][0] == FREE for s in range(4) if s not in held)
    slot = snap.tier_blocks[held[0]]
    text = "".join(eng.decode([t]) for t in slot.token_ids)
    assert f"hash {slot.block_hash & 0xFFFFFFFF:08x}" in cells[held[0]][2] and text in cells[held[0]][2]
    assert "overwritten next" in cells[snap.tier_lru[0]][2]
    assert any(n.startswith(TIER_NOTE) for n in notes(fig))
    assert trace(fig, "cpu tier").y[0] < min(trace(fig, "pool").y)  # under the GPU pool


def test_an_offload_draws_an_arrow_from_the_gpu_block_to_its_slot():
    eng = tiered()
    evict_into_the_tier(eng)
    offloads = [e for e in eng.last_events if e.kind == "offload"]
    assert offloads
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    arrows = trace(fig, "offload")
    assert sum(x is None for x in arrows.x) == len(offloads)
    tier_y = trace(fig, "cpu tier").y[0]
    assert arrows.y[1] > tier_y and arrows.y[0] > arrows.y[1]  # down, from the pool to the tier
    assert len(trace(fig, "swap slide").x) == len(offloads)  # the dots the page slides
    assert "offload to the CPU tier" in fig.layout.title.text
    assert "load from the CPU tier" not in fig.layout.title.text


def test_a_load_draws_an_arrow_from_its_slot_to_the_gpu_block_it_filled():
    eng = tiered()
    evict_into_the_tier(eng)
    eng.free(1)
    eng.add_sequence(list(range(65, 78)))  # the first prompt again: its evicted block comes back
    (load,) = [e for e in eng.last_events if e.kind == "load"]
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    go.Figure(json.loads(fig.to_json()))
    arrows = trace(fig, "load")
    assert sum(x is None for x in arrows.x) == len(load.block_ids)
    assert arrows.y[0] < arrows.y[1]  # up, from the tier to the pool
    slide = trace(fig, "swap slide")
    assert [slide.x[-1], slide.y[-1]] == [arrows.x[1], arrows.y[1]]  # ends on the GPU block
    assert slide.customdata[-1] == [arrows.x[0], arrows.y[0]]  # starts at the tier slot
    assert "load from the CPU tier" in fig.layout.title.text


def test_the_tier_sits_under_the_swap_space_when_there_is_one():
    eng = tiered(num_cpu_blocks=4)
    evict_into_the_tier(eng)
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    assert trace(fig, "cpu tier").y[0] < trace(fig, "cpu pool").y[-1]
    assert fig.layout.yaxis.range[0] < trace(fig, "cpu tier").y[-1]  # in view


def test_the_metrics_panel_counts_the_tier():
    eng = tiered()
    evict_into_the_tier(eng)
    snap = eng.snapshot()
    html = metrics_html(snap, eng.engine_info(), eng.max_model_len)
    held = sum(b.state == "cached" for b in snap.tier_blocks)
    assert f"CPU tier slots holding cached blocks</td><td><b>{held} of 4" in html
    plain = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=6))
    assert "CPU tier" not in metrics_html(plain.snapshot(), plain.engine_info(), 64)


def test_the_picture_names_a_request_whose_blocks_are_coming_back() -> None:
    eng = LLMEngine(EngineConfig(model=None, block_size=8, num_gpu_blocks=16, num_offload_blocks=32))
    eng.generate("You are a helpful assistant who answers questions. France?", SamplingParams(max_tokens=4))
    eng.generate("x" * 100, SamplingParams(max_tokens=4))
    eng.add_request("yz", SamplingParams(max_tokens=8))  # beside it, a load waits a step
    eng.step()
    eng.add_request("You are a helpful assistant who answers questions. Spain?", SamplingParams(max_tokens=4))
    eng.step()
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    assert any("loading" in a.text for a in fig.layout.annotations)
