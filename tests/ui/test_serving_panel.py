"""The Serving tab shows what it produced: a request is on the page from the moment it is added,
and after "Run to the end" each sample's or beam's text and score stay; the last step's picture
draws no copy-on-write arrow into a block that step freed."""

from __future__ import annotations

import re

import pytest

from engine import EngineConfig, SamplingParams, ops
from ui.page import show
from ui.session import Session


def dry_session(prefix_caching: bool = True) -> Session:
    return Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=32,
                            enable_prefix_caching=prefix_caching))


def texts(session: Session) -> str:
    _, _fig, _events, seqs, *_ = show(session)  # what the serving handlers return to the page
    return seqs


def run_to_the_end(session: Session):
    """What the "Run to the end" button does (ui/serving_panel.py)."""
    while session.engine.has_pending_work():
        session.run(ops.Step())
    return show(session)


def test_an_added_request_shows_as_waiting_with_its_prompt():
    s = dry_session()
    s.run(ops.AddRequest("Paged memory is", SamplingParams(max_tokens=4, n=2, temperature=1.0)))
    html = texts(s)
    assert "data-request='0' data-status='waiting'" in html
    assert "Paged memory is" in html and "n = 2" in html and "1 waiting" in html
    s.run(ops.Step())
    assert "data-status='running'" in texts(s)


def samples(html: str, rid: int) -> list[tuple[str, str]]:
    """(text, score) of each output of request `rid` in the panel."""
    block = re.search(rf"data-request='{rid}'.*?</ol>", html, re.S).group(0)
    return re.findall(r"data-score='([^']+)'>.*?class='output-text'[^>]*>(.*?)</span>", block, re.S)


def test_run_to_the_end_keeps_every_sample_and_beam_with_its_text_and_score():
    s = dry_session()
    s.run(ops.AddRequest("Paged memory is", SamplingParams(max_tokens=5, n=2, temperature=1.0)))
    s.run(ops.AddRequest("Beams", SamplingParams(max_tokens=4, beam_width=2)))
    _, fig, _, html, *_ = run_to_the_end(s)
    assert "No sequences" not in html
    done = {o.request_id: o for o in s.engine.finished_requests()}
    for rid, word in ((0, "sample"), (1, "beam")):
        shown = samples(html, rid)
        want = [(f"{c.cumulative_logprob:.3f}", c.text) for c in done[rid].outputs]
        assert len(shown) == 2 and shown == want and all(t for _, t in shown)
        assert f"{word} 1" in html and f"{word} 2" in html
    assert "beam score" in html and "log prob" in html and "2 finished" in html
    # Back and forward again: the same outcome, rebuilt by the replay
    s.goto(len(s.ops) - 1)
    s.goto(len(s.ops))
    assert texts(s) == html


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("params", [SamplingParams(max_tokens=2, n=2, temperature=1.0),
                                SamplingParams(max_tokens=4, beam_width=2)])
def test_the_last_step_draws_no_cow_arrow_into_a_freed_block(caching, params):
    s = dry_session(caching)
    s.run(ops.AddRequest("Paged memory is", params))
    _, fig, *_ = run_to_the_end(s)
    # the last step copied on write, then finished the request and freed every block
    assert any(e.kind == "cow" for e in s.engine.last_events)
    snap = s.engine.snapshot()
    used = {b.block_id for b in snap.blocks if b.state == "used"}
    assert not used  # everything finished
    arrows = [t for t in fig.data if t.name == "copy-on-write"]
    assert not arrows and not [t for t in fig.data if t.name == "new block"]
    freed = [t for t in fig.data if t.name == "freed label"]
    assert freed and "freed" in "".join(freed[0].text)
