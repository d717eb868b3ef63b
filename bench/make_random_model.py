"""A model folder with the default model's shapes and tokenizer but random weights, for GPU
runs where the real weights cannot travel (the device machine has no network, and the GGUF is
larger than what a run may carry). Throughput depends on shapes, not on weights; note that random
weights give flat next-token distributions (the hardest case for top-p).

    python bench/make_random_model.py --src FOLDER_WITH_CONFIG_AND_TOKENIZER --out /tmp/smollm2
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

# only the repository root: bench/'s own scripts must not shadow installed modules
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, help="config.json + tokenizer files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    src, out = Path(args.src), Path(args.out)
    config = AutoConfig.from_pretrained(src)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.suffix == ".jinja":
            shutil.copy(f, out / f.name)
    print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M random parameters")


if __name__ == "__main__":
    main()
