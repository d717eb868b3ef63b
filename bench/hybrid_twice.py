"""issue 44's hybrid part (bench/mem_parts.py `hybrid`, 4,096-token prompts only) twice in one
process: how far its figures move from one engine to the next, with the first prefill steps'
kernel and host operation tables.

    python bench/hybrid_twice.py bench/results/mem_h100_run4_hybrid_twice.json   # a GPU
"""
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import mem_gpu, mem_models, mem_parts  # noqa: E402

sizes = {**mem_gpu.FULL, "hybrid_prompts": [4096]}
folder = Path(tempfile.mkdtemp())
tok, _ = mem_models.tokenizer()
paths = {k: mem_models.build(k, folder, tok, "cuda") for k in ("hybrid", "full")}
out = []
for _ in range(2):
    got = mem_parts.hybrid(paths, "cuda", sizes)["4096"]
    keys = ("runs_s", "prefill_steps_s", "decode_steps_s", "prefill_profile")
    row = {n: {k: got[n][k] for k in keys} for n in ("hybrid", "full")}
    row["ratio"] = got["hybrid_over_full"]
    out.append(row)
    print(json.dumps({n: (row[n]["runs_s"], row[n]["prefill_steps_s"],
                          row[n]["prefill_profile"]["wall_ms"]) for n in ("hybrid", "full")}),
          flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
