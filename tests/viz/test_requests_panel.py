"""The requests panel (viz/requests_panel.py) and the "freed" overlay: pure functions of the
engine's public queries, a snapshot and the last step's events."""

import json

import plotly.graph_objects as go

from engine import EngineConfig, LLMEngine, SamplingParams
from viz import pool_figure, requests_html
from viz.requests_panel import added_requests


def served(**params) -> LLMEngine:
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=16,
                                 preemption_mode="swap", num_cpu_blocks=8))
    eng.add_request("<b>Paged</b>", SamplingParams(**params))
    return eng


def panel(eng: LLMEngine) -> str:
    return requests_html(eng.requests(), eng.finished_requests(), eng.snapshot(), eng.decode,
                         added_requests(eng.trace))


def test_no_request_no_panel_and_text_is_escaped():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=16))
    assert panel(eng) == ""
    eng = served(max_tokens=3)
    html = panel(eng)
    assert "&lt;b&gt;Paged&lt;/b&gt;" in html and "<b>Paged" not in html
    assert html == panel(eng)  # pure: the same inputs, the same HTML


def test_a_token_list_prompt_is_decoded_and_finished_outputs_name_their_reason():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=16))
    eng.add_request(eng.encode("abc"), SamplingParams(max_tokens=2))
    while eng.has_pending_work():
        eng.step()
    html = panel(eng)
    assert "request-prompt' style='font-family:monospace'>abc<" in html
    assert "hit max tokens" in html and "data-status='finished'" in html


def test_the_freed_overlay_is_valid_plotly_and_only_on_blocks_not_in_use():
    eng = served(max_tokens=2, n=2, temperature=1.0)
    while eng.has_pending_work():
        eng.step()
    fig = pool_figure(eng.snapshot(), eng.last_events, eng.decode)
    go.Figure(json.loads(fig.to_json()))  # raises ValueError on anything invalid
    names = {t.name for t in fig.data}
    assert {"freed", "freed label"} <= names and "copy-on-write" not in names
    # a step that frees nothing draws no "freed" mark
    eng2 = served(max_tokens=4)
    eng2.step()
    assert "freed" not in {t.name for t in pool_figure(eng2.snapshot(), eng2.last_events).data}
