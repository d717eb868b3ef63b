"""Engines made one after another in one process: does a later one step slower than the first?

    python bench/engines_in_turn.py --out "$OUT/engines_in_turn.json"       # one GPU: ~2 minutes
    python bench/engines_in_turn.py --smoke --out /tmp/engines_in_turn.json

Run 12 measured the 1.2B step at 256 sequences at 2.82 ms in an engine that was its process's
first; `mem_gpu.py --only roofline` (run 14), whose 256-sequence engine is its process's third,
measured 4.81 ms. Here the same engine is made `--engines` times in one process, each running
the same steady decode (bench/step_timeline.py's phases), and after each is closed: whether it
is still alive (a weak reference after a collection), the device memory still allocated and
reserved, and the objects the collector tracks.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import weakref
from pathlib import Path

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import device_step, mem_models  # noqa: E402
from bench import hybrid as prompts_of  # noqa: E402
from bench.step_timeline import summary, timed_steps  # noqa: E402
from engine import SamplingParams  # noqa: E402


def one_engine(path: str, device: str, n: int, plen: int, new: int) -> tuple[dict, weakref.ref]:
    eng = device_step.engine(path, device, 0, n, n * -(-(plen + new) // 16) + 64)  # the roofline's
    prompts = prompts_of._prompts(n, plen, plen, n)
    eng.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))
    for p in prompts:
        eng.add_request(p, SamplingParams(max_tokens=new, ignore_eos=True))
    rows = timed_steps(eng, device, lambda r: r.num_decodes == n and not r.num_prefills)
    eng.close()
    return summary(rows[2:]), weakref.ref(eng)


def device_memory(device: str) -> dict:
    if device != "cuda":
        return {}
    torch.cuda.synchronize()
    return {"allocated_mb": round(torch.cuda.memory_allocated() / 2**20, 1),
            "reserved_mb": round(torch.cuda.memory_reserved() / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    n, plen, new = (args.seqs, 512, 64) if not args.smoke else (4, 48, 12)
    tok, note = mem_models.tokenizer()
    folder = Path(tempfile.mkdtemp(prefix="engines-"))
    path = mem_models.build("one_b", folder, tok, args.device, 2 if args.smoke else None)
    out: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                 "torch": torch.__version__, "tokenizer": note, "seqs": n, "prompt": plen,
                 "new": new, "engines": []}
    for i in range(args.engines):
        t0 = time.perf_counter()
        steady, ref = one_engine(path, args.device, n, plen, new)
        gc.collect()
        row = {"engine": i, "steady": steady, "alive_after_close": ref() is not None,
               "tracked_objects": len(gc.get_objects()), **device_memory(args.device),
               "seconds": round(time.perf_counter() - t0, 1)}
        out["engines"].append(row)
        print(json.dumps({k: row[k] for k in row if k != "steady"} | {
            "step_ms": steady.get("median_ms", {}).get("wall_ms"),
            "phases": steady.get("median_ms")}), flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
