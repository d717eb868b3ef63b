"""The tier's load with its bus copy issued before the wait on the compute stream (the engine's
now) against after it (before 2026-11-27), in `tier.overlap` and `tier.bandwidth`, by turns
on one lease, with the plain pinned link measured around each: does the order matter, and how
much do those figures move from one engine to the next?

    python bench/tier_load_order.py bench/results/tier_load_order_ab_h100.json   # a GPU
"""
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from bench import hybrid, mem_parts, tier  # noqa: E402
from engine.runtime.tier_copies import TierCopies  # noqa: E402

NEW = TierCopies.load


def old_load(self, kv_cache, pairs):
    """TierCopies.load as it was: the bus copy waited for the compute stream's queue too."""
    queued = torch.cuda.Event()
    queued.record()
    self._load_stream.wait_event(queued)  # before any of NEW's work on the load stream
    NEW(self, kv_cache, pairs)


folder = Path(tempfile.mkdtemp())
path = hybrid.build(folder / "one_b", False, hybrid.ONE_B)
out = {"link_first": mem_parts.link_bandwidth("cuda"), "runs": []}
print(json.dumps(out), flush=True)
for _ in range(2):
    for name, fn in (("new", NEW), ("old", old_load)):
        TierCopies.load = fn
        row = {"order": name, "link": mem_parts.link_bandwidth("cuda"),
               "bandwidth": tier.bandwidth(path, "cuda", tier.FULL),
               "overlap": tier.overlap(path, "cuda", tier.FULL)}
        out["runs"].append(row)
        print(json.dumps(row), flush=True)
out["link_last"] = mem_parts.link_bandwidth("cuda")
print(json.dumps(out["link_last"]), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
