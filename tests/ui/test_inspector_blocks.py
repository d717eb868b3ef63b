"""The block inspector on every kind of block the picture lets a class click (issue 37): owned,
shared and cached blocks show their real K/V; a free block, a block a sliding window dropped, a
CPU swap block and a CPU tier slot get a sentence, never an error. A lesson's inspector reads the
engine in the state its page shows, after any Back / Next, and a page whose picture holds an
earlier moment of its step is read from an engine rebuilt at that moment, never the live one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from lessons import LessonRun, load
from ui.front import front
from ui.inspector_panel import NO_KV, cpu_block, kv_view, shown_block
from ui.lesson_pages import LessonSession
from ui.session import Session

pytestmark = pytest.mark.slow


def _heat(fig) -> list:
    return [t for t in fig.data if t.type == "heatmap"]


def test_owned_shared_and_cached_blocks_show_their_kv_and_a_free_block_says_it_has_none(default_model):
    eng = LLMEngine(EngineConfig(model="default", block_size=4, num_gpu_blocks=12, device="cpu",
                                 dtype="float32"))
    a = eng.add_sequence("The three best things about summer are")
    b = eng.fork(a)
    snap = eng.snapshot()
    shared = snap.sequences[a].block_table[0]
    note, fig = kv_view(eng, snap, eng.decode, shared, 0)
    assert "ref count 2" in note and len(_heat(fig)[0].y) == 4  # four slots, one row each
    eng.append(a, n=1)  # copy-on-write: the copy is a's own
    snap = eng.snapshot()
    own = snap.sequences[a].block_table[-1]
    note, fig = kv_view(eng, snap, eng.decode, own, 0)
    assert "held by seq 0" in note and fig is not None
    eng.free(a)
    eng.free(b)
    snap = eng.snapshot()
    cached = next(x.block_id for x in snap.blocks if x.state == "cached")
    note, fig = kv_view(eng, snap, eng.decode, cached, 0)
    assert "cached" in note and fig is not None
    free = next(x.block_id for x in snap.blocks if x.state == "free")
    note, fig = kv_view(eng, snap, eng.decode, free, 0)
    assert note.endswith(NO_KV) and fig is None  # a sentence, not "cannot reshape tensor"


def test_a_dropped_block_and_cpu_blocks_get_a_sentence():
    hybrid = LLMEngine(EngineConfig(model="tiny-hybrid", block_size=8, num_gpu_blocks=24, device="cpu",
                                    dtype="float32"))
    s = hybrid.add_sequence("A sliding window keeps only the most recent tokens in view.")
    hybrid.append(s, n=40)
    drops = [b for e in hybrid.last_events if e.kind == "drop" for b in e.block_ids]
    snap = hybrid.snapshot()
    assert drops
    for b in drops:  # a full dropped block stays cached (its K/V kept), a partial one is free
        note, fig = kv_view(hybrid, snap, hybrid.decode, b, 1)
        if snap.blocks[b].num_filled:
            assert "cached" in note and fig is not None
        else:
            assert "free" in note and note.endswith(NO_KV) and fig is None
    swap = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=8, num_cpu_blocks=8,
                                  preemption_mode="swap", num_offload_blocks=4))
    for p in ("abcdefgh", "ijklmnop", "qrstuvwx"):
        swap.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True))
    while not any(b.ref_count for b in swap.snapshot().cpu_blocks):
        swap.step()
    snap = swap.snapshot()
    c = next(b.block_id for b in snap.cpu_blocks if b.ref_count)
    assert "swap space" in cpu_block(snap, swap.decode, "cpu", c) and "holds" in cpu_block(
        snap, swap.decode, "cpu", c)
    assert "tier slot t0" in cpu_block(snap, swap.decode, "tier", 0)
    assert "There is no" in cpu_block(snap, swap.decode, "tier", 99)


def test_a_lessons_inspector_reads_the_state_its_page_shows(default_model):
    ls = LessonSession()
    ls.play(LessonRun(load(Path("lessons") / "03_fork_cow.md"), device="cpu", dtype="float32"))
    session = Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=8))
    session.front = ls
    shown = front(session)
    for _ in range(4):
        ls.run.next()
    ls.run.back()
    page = ls.run.next()  # page 4 again, as a teacher goes back to repeat a point
    copy = page.snapshot.sequences[0].block_table[-1]
    note, fig = shown_block(shown, copy)
    assert "4 of 4 slots filled" in note and len(_heat(fig)[0].y) == 4
    while not ls.run.done:
        page = ls.run.next()
    # the last page's picture is the step of the first copies, not the end (`show`): its
    # engine is rebuilt there, and its bytes are those of that moment
    copies = [e.block_ids[1] for e in page.events if e.kind == "cow"]
    assert copies and all(page.snapshot.blocks[b].num_filled for b in copies)
    live = ls.run.history.engine_at(len(ls.run.history)).snapshot()
    assert any(live.blocks[b].token_ids != page.snapshot.blocks[b].token_ids for b in copies)
    note, fig = shown_block(shown, copies[0])
    then = ls.run.engine_for(page)  # the run's engine, moved back to the page's moment
    assert then.snapshot().blocks == page.snapshot.blocks
    k, _ = then.inspect_block(copies[0], 0)
    filled = page.snapshot.blocks[copies[0]].num_filled
    shown = torch.tensor(_heat(fig)[0].z)
    assert torch.equal(shown, k[:filled].reshape(filled, -1))
