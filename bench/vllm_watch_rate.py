"""How many KV events a second PagedLab's VllmWatch keeps up with, on this machine: vLLM's own
publisher (bench/vllm_publisher.py, in vLLM's venv: its ZmqEventPublisher, its msgspec types)
sends batches over loopback ZMQ to a watch in this process, flat out and paced. Per run: events
received of those sent (gaps replayed or lost), events a second from the first message to the
last, the watch's own CPU time per event (its ceiling on one core), and how late messages were
read (now - the batch's timestamp). Writes bench/results/vllm_watch_rate.json.

    .venv/bin/python bench/vllm_watch_rate.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.vllm.server import free_port, vllm_python  # noqa: E402
from engine.vllm.watch import VllmWatch  # noqa: E402

RUNS = [  # (name, batches, events per batch, paced events/s or 0: flat out)
    ("flat out, 1 event a message", 40_000, 1, 0),
    ("flat out, 4 events a message", 20_000, 4, 0),
    ("flat out, 16 events a message", 10_000, 16, 0),
    ("paced 10,000 events/s, 4 a message", 25_000, 4, 10_000),
]


def one_run(python: str, name: str, batches: int, per_batch: int, rate: float) -> dict:
    endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    want = batches * per_batch
    with VllmWatch(endpoint, replay, bind=True, silence_s=600) as watch:  # vLLM imports slowly
        pub = subprocess.Popen([python, str(ROOT / "bench" / "vllm_publisher.py"), "--endpoint",
                                endpoint, "--replay", replay, "--batches", str(batches),
                                "--per-batch", str(per_batch), "--rate", str(rate)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        got, lags, first, last, cpu0 = 0, [], None, None, None
        deadline = time.monotonic() + 300
        while got < want and time.monotonic() < deadline:
            events = watch.poll(0.2)
            if not events:
                continue
            now = time.time()
            if first is None:
                first, cpu0 = time.perf_counter(), time.process_time()
            last = time.perf_counter()
            got += len(events)
            lags.append(now - events[-1].ts)
        cpu = time.process_time() - (cpu0 or 0.0)
        sent = json.loads(pub.communicate(timeout=120)[0].strip().splitlines()[-1])
        problems = [p.message for p in watch.problems]
        tree_blocks = watch.counts().blocks
    lags.sort()
    span = (last - first) if first is not None and last is not None and last > first else None
    return {"run": name, "events_sent": sent["events"], "events_received": got,
            "publisher_sent_s": round(sent["sent_s"], 3), "paced_events_per_s": rate,
            "received_events_per_s": round(got / span) if span else None,
            "watch_cpu_us_per_event": round(cpu / got * 1e6, 2) if got else None,
            "watch_ceiling_events_per_s": round(got / cpu) if cpu > 0 else None,
            "lag_p50_ms": round(lags[len(lags) // 2] * 1e3, 1) if lags else None,
            "lag_max_ms": round(lags[-1] * 1e3, 1) if lags else None,
            "problems": problems, "blocks_in_tree_at_end": tree_blocks}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a short run of each (smoke)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vllm_watch_rate.json"))
    args = ap.parse_args()
    python = vllm_python()
    load_before = os.getloadavg()
    runs = [one_run(python, name, b // 20 if args.quick else b, k, r) for name, b, k, r in RUNS]
    for r in runs:
        print(json.dumps(r))
    result = {"machine": f"{os.cpu_count()} cores", "load_before": load_before,
              "load_after": os.getloadavg(), "publisher": "vLLM 0.32.0 ZmqEventPublisher",
              "quick": args.quick, "runs": runs}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
