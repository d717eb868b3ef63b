"""PagedLab's block hashes against vLLM's own functions, run in vLLM's venv: every algorithm,
with vLLM's default seed and with PYTHONHASHSEED set (`hash_seed`), on blocks with token ids
small and large (pickle and CBOR encode them in different widths)."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from engine.core.hashing import hash_function

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("vllm_hashes.py")


def vllm_hashes(python: str, blocks: list[list[int]], seeds: list[str | None]) -> dict:
    """{seed: {algo: hashes}} from vLLM's own functions, in one vLLM process."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    run = subprocess.run([python, str(SCRIPT)], input=json.dumps({"blocks": blocks, "seeds": seeds}),
                         env=env, text=True, capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_every_algorithm_and_seed_gives_the_hashes_vllm_computes(vllm_boot):
    rng = random.Random(41)
    blocks = [[rng.choice([0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 49151])
               for _ in range(32)] for _ in range(6)]
    seeds = [None, "0", "12345"]
    theirs = vllm_hashes(vllm_boot.python, blocks, seeds)
    for seed in seeds:
        for algo, want in theirs[str(seed)].items():
            if seed is None and algo.startswith("xxhash"):
                continue  # vLLM draws a random seed per process: nothing to compare with
            fn, parent, ours = hash_function(algo, seed), None, []
            for block in blocks:
                parent = fn(parent, block)
                ours.append(parent)
            assert ours == want, (algo, seed)
