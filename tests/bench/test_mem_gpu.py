"""Issue 44's GPU run (bench/mem_gpu.py): its table says what each part measured against its goal
and names a part that failed or was skipped instead of dropping its row; its models load in the
engine with the stand-in tokenizer of a machine without the default one; and its smoke mode runs
a part end to end on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import mem_models
from bench.mem_parts import paired_ratio
from bench.mem_table import rows, table
from engine import EngineConfig, LLMEngine, SamplingParams

ROOT = Path(__file__).resolve().parents[2]


def _result() -> dict:
    step = {"tokens_per_s": 100.0, "prefill_steps_s": 0.2, "decode_steps_s": 1.0, "step_ms": 2.0,
            "graph_gpu_ms": 1.5}
    return {
        "device": "NVIDIA H100", "total_s": 500,
        "spec": {"rows": [{"batch": b, "drafts_over_none": r, "same_tokens": True,
                           "k4": {"tokens_per_pass": 4.4}} for b, r in ((1, 3.9), (8, 3.0), (64, 1.9))],
                 "hf_prompt_lookup": {"tokens_per_pass": 4.57}},
        "rejects": {"error": "RuntimeError: out of memory"},
        "hybrid": {"4096": {"requests": 32, "hybrid_over_full": 1.45, "ratio_of_medians": 1.05,
                            "per_round": [1.5, 1.45, 1.02, 1.47, 1.4],
                            "hybrid": {**step, "tokens_per_s": 145.0}, "full": step}},
        "tier": {"skipped": "20 s of the budget left"},
        "roofline": {"64": {"async_over_roofline": 1.25, "async_step_ms": 1.4, "roofline_ms": 1.12,
                            "graph_over_roofline": 1.2, "sync_step_ms": 2.0}},
        "tests": {"summary": "12 passed in 80.0s"}}


def test_the_table_says_each_goal_met_or_not_and_why_a_row_is_missing() -> None:
    got = {what.rsplit(" (", 1)[0]: (measured, met) for what, measured, met in rows(_result())}
    assert got["drafts k = 4 / none, repetitive prompts, batch 1 / 8 / 64"][1] is True
    assert "out of memory" in got["drafts on at batch 64, temperature-1 rejections"][0]
    assert got["hybrid (half the layers a 128-token window) / all full, 32 × 4,096-token prompts"][1]
    assert "20 s of the budget left" in got["the CPU tier"][0]
    assert got["1.2B decode step / HBM roofline, 64 sequences, context 512"][1] is True
    text = table(_result())
    assert text.count("| **no** |") == 2 and "12 passed" in text


def test_a_second_run_of_the_same_code_gets_a_column_of_its_own() -> None:
    other = _result()
    other["hybrid"]["4096"]["hybrid_over_full"] = 1.1  # another lease: under the goal
    other.pop("roofline")
    lines = table(_result(), ("run 6", other)).splitlines()
    assert lines[0] == "| what | measured | met | run 6 | met |"
    hybrid = next(line for line in lines if "4,096-token prompts" in line)
    cells = [c.strip() for c in hybrid.strip("|").split(" | ")]
    assert cells[1].startswith("1.450x") and cells[2] == "yes"
    assert "median of 5 rounds by turns, 1.02-1.50 (ratio of medians 1.050)" in cells[1]
    assert cells[3].startswith("1.100x") and cells[4] == "**no**"
    roof = next(line for line in lines if "64 sequences" in line)
    assert roof.endswith("| yes | not run | — |")


def test_a_ratio_by_turns_is_the_median_of_each_rounds_own() -> None:
    # both sides slow in round 2, the other side alone in round 3: its median is a slow run
    # (a ratio of medians would read 1.2 / 2.0 = 0.6), the rounds side by side read 1.2
    base, other = [1.2, 2.4, 1.2], [1.0, 2.0, 2.0]
    assert paired_ratio(base, other) == (1.2, [1.2, 1.2, 0.6])


def test_a_rejects_model_has_a_small_vocabulary_and_serves_with_the_stand_in(tmp_path) -> None:
    tok = mem_models.stand_in_tokenizer()
    assert len(tok) == 49152 and (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    path = mem_models.build("rejects_smol", tmp_path, tok, "cpu", layers=1)
    eng = LLMEngine(EngineConfig(model=path, device="cpu", dtype="float32", num_gpu_blocks=32))
    assert eng.vocab_size == mem_models.REJECT_VOCAB
    out = eng.generate([[40, 41, 42, 40, 41]], SamplingParams(max_tokens=6, temperature=1.0,
                                                              seed=1, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 6
    assert all(t < mem_models.REJECT_VOCAB for t in out[0].outputs[0].token_ids)


@pytest.mark.slow
def test_the_run_goes_end_to_end_on_a_cpu(tmp_path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "mem_gpu.py"), "--smoke",
                           "--only", "spec", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "mem_gpu.json").read_text())
    assert result["spec"]["rows"] and "| what | measured | met |" in proc.stdout
