"""The GPU benchmarks' CPU smoke modes: each script still runs end to end as one command and
writes the JSON the README's table is built from (the GPU numbers themselves come from the
device runs committed under bench/results/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(script: str, out: Path, timeout: int) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_kernel_bench_smoke(tmp_path):
    result = run("kernel_speed.py", tmp_path / "kernels.json", 300)
    assert result["smoke"] and result["decode"] and "copy_blocks" in result and "swap" in result
    row = result["decode"][0]
    assert {"shuffled_us", "sdpa_us", "paged_over_sdpa", "shuffled_over_identity"} <= set(row)


@pytest.mark.slow
def test_sampler_bench_smoke(tmp_path):
    result = run("sampler_micro.py", tmp_path / "sampler.json", 300)
    assert result["smoke"] and result["path"] in ("torch draw", "fused triton kernel")
    assert all(result[f"{case}_ms"] > 0 for case in ("greedy", "temperature", "temperature_top_p",
                                                      "top_k_top_p"))


@pytest.mark.slow
@pytest.mark.model
def test_engine_bench_smoke(tmp_path):
    result = run("engine_throughput.py", tmp_path / "engine.json", 600)
    assert result["device"].startswith("cpu")
    assert result["engine"]["tokens_per_s"] > 0 and result["engine"]["steps"] > 0
    # greedy float32 on the CPU: the engine's outputs are HF generate's, token for token
    eq = result["float32_equivalence"]["engine_vs_hf_generate"]
    assert eq["identical"] == eq["of"] == result["requests"]
    assert (tmp_path / "engine_profile.txt").exists()


@pytest.mark.slow
@pytest.mark.model
def test_serving_suite_smoke(tmp_path):
    result = run("serving_suite.py", tmp_path / "suite.json", 600)
    assert result["smoke"] and result["device"].startswith("cpu")
    for name in ("cold_start", "ragged_greedy", "ragged_sampled", "parallel_n8", "beam4",
                 "shared_system_prompt", "long_context", "concurrency"):
        assert "error" not in result[name], (name, result[name])
    assert result["ragged_sampled"]["engine"]["tokens"] > 0
    assert result["ragged_greedy"]["hf_generate"]["tokens_per_s"] > 0
    assert result["parallel_n8"]["sampled_over_greedy_step"] > 0
    assert result["shared_system_prompt"]["prefix_hit_blocks"] > 0


@pytest.mark.slow
def test_hybrid_bench_smoke(tmp_path):
    """bench/hybrid.py's speed and tier parts on two layers (the exactness part, which runs HF
    generate, is covered by tests/engine/runtime/test_sliding_window_models.py), one timed run
    each: a 300-token prompt still outgrows the 128-token window, a 32-token system prompt
    still fills two cached blocks that a 56-token document pushes out of a 4-block pool."""
    out = tmp_path / "hybrid.json"
    sizes = ("prompt=16", "decode=2", "long=300", "speed_runs=1",
             "system=32", "doc=56", "pool=4", "tier_runs=1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "hybrid.py"), "speed", "tier",
                           "--smoke", *(a for size in sizes for a in ("--set", size)),
                           "--device", "cpu", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    speed, tier = result["speed"], result["tier"]["smollm2_shape"]
    assert speed["hybrid"]["blocks_held"]["sliding"] <= 128 // 16 + 1
    assert speed["hybrid"]["bytes_held"] < speed["full"]["bytes_held"]
    assert tier["with_tier"]["offload_hit_blocks"] > 0 and tier["same_tokens"]


def test_dry_step_bench_smoke(tmp_path):
    result = run("dry_step.py", tmp_path / "dry_step.json", 300)["after"]
    for name in ("greedy", "sampled"):
        for oracle in ("default", "oracle_on", "oracle_off"):
            times = result[f"{name}_{oracle}"]
            assert 0 < times["cpu"]["min_ms"] <= times["cpu"]["median_ms"], (name, oracle)


@pytest.mark.slow
@pytest.mark.model
def test_checkpoints_bench_smoke(tmp_path):
    result = run("checkpoints.py", tmp_path / "checkpoints.json", 600)["after"]
    assert result["dry_4096_blocks"]["used_blocks"] == 4096
    assert result["default_model_64_blocks"]["saved_kv_bytes"] > 0
    for engine in ("dry_4096_blocks", "default_model_64_blocks"):
        assert all(result[engine][what]["min_ms"] > 0 for what in ("take", "restore"))


@pytest.mark.slow
def test_spec_host_bench_smoke(tmp_path):
    result = run("spec_host.py", tmp_path / "spec_host.json", 300)
    for mode in ("dry", "tiny_model"):
        assert result[mode]["same_tokens"] and result[mode]["k0"]["lookups"] == 0
        assert result[mode]["k4"]["host_ms_per_step"] > 0 and result[mode]["k4"]["steps"] > 0


@pytest.mark.slow
def test_dry_bookkeeping_bench_smoke(tmp_path):
    result = run("dry_bookkeeping.py", tmp_path / "dry_bookkeeping.json", 300)
    assert result["repeat"]["tier"]["offload_hit_blocks"] > 0  # the document came from the tier
    assert result["repeat"]["recompute"]["offload_hit_blocks"] == 0
    assert all(s > 0 for side in result["prefill"].values() for s in side["prefill_host_s"])
