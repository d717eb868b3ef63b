"""A classroom at once: many concurrent sessions on one served PagedLab, through gradio_client.

Starts `python app.py` (the real default model loaded, as a Space would) and drives it with
`--dry-sessions` clients that switch their session to a dry pool ("/on_apply") and run `--ops`
operations each, plus `--real-sessions` clients that stay on SmolLM2-135M, all at once. Reports
p50 / p95 / max latency per operation kind as the client sees it, errors, refusals (clear
messages, e.g. a full pool) and the server process's RSS (psutil) at start, before the load
(after a warm-up session), at its peak during, and after every client has closed.

The clients click back to back with no think time (a saturation test, far harsher than a class),
and they are threads of this one Python process on the same 2 cores: latency includes queueing
and the clients' own decoding of every figure. `server_cpu_ms_per_op` and `client_cpu_seconds`
say where the CPU went.

Closing: gradio_client has no "end session" call; `Client.close()` stops its heartbeat stream,
and when that connection drops the server runs the app's unload handler, which frees the
session's engine (its KV pool). Gradio itself keeps a closed session's gr.State (here: config +
op log only) for an hour in case the browser reconnects. "After" is measured once that has had
time to happen (--settle seconds).

Isolation: at the end each session exports its trace ("/on_export" -> "?trace=..."); the bench
rebuilds it locally with Session.from_link and renders it; the sequences and metrics panels must
equal what the server last returned to that client.

    python bench/load.py [--dry-sessions 32] [--ops 50] [--real-sessions 4] [--real-ops 16]
                         [--out bench/results/load.json]
    python bench/load.py --room-students 60   # a classroom room instead (bench/room_load.py)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.measure import RssSampler, pct, rss_mb  # noqa: E402
from bench.room_load import run_room  # noqa: E402
from ui.app_process import free_port, launch, stop  # noqa: E402

DRY = "dry (bookkeeping only, no model)"
PROMPTS = ["Four score and seven years ago", "Paged memory is", "The cat sat on the mat",
           "Four score and seven years ago our fathers", "KV cache"]


@dataclass
class SessionRun:
    name: str
    real: bool
    ops: int
    seed: int
    latencies: list[tuple[str, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    last_views: Any = None
    link: str = ""


def drive(url: str, run: SessionRun, start: threading.Barrier) -> None:
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    rng = random.Random(run.seed)
    client = Client(url, verbose=False)
    live: list[str] = []

    def call(kind: str, *args: Any, api: str | None = None) -> Any:
        t = time.perf_counter()
        try:
            out = client.predict(*args, api_name=api or f"/on_{kind}")
        except AppError as err:  # a gr.Error: the user sees this message; the session is unchanged
            run.latencies.append((kind, time.perf_counter() - t))
            message = str(err)
            if not message or "something went wrong" in message:
                run.errors.append(f"{kind}: {message}")
            else:
                run.refusals.append(f"{kind}: {message[:120]}")
            return None
        except Exception as err:  # noqa: BLE001 (a timeout, a dropped connection: an error)
            run.latencies.append((kind, time.perf_counter() - t))
            run.errors.append(f"{kind}: {type(err).__name__}: {err}")
            return None
        run.latencies.append((kind, time.perf_counter() - t))
        if kind != "export" and isinstance(out, tuple | list) and len(out) == 7:
            run.last_views = out
            live[:] = [c[0] if isinstance(c, list | tuple) else c for c in out[5]["choices"]]
        return out

    try:
        start.wait()
        if not run.real:
            call("apply", DRY, 4, 64, True)
        call("new", rng.choice(PROMPTS), False)
        for _ in range(run.ops - 1):
            r = rng.random()
            seq = rng.choice(live) if live else None
            if seq is None or (r < 0.12 and len(live) < 5):
                call("new", rng.choice(PROMPTS), False)
            elif r < 0.45:
                call("append", seq, rng.randint(1, 3 if not run.real else 2))
            elif r < 0.55 and len(live) < 6:
                call("fork", seq)
            elif r < 0.63 and len(live) > 1:
                call("free", seq)
            elif r < 0.70:
                call("add_request", rng.choice(PROMPTS), 1 + (r < 0.66), 1, rng.randint(2, 6), 0.0)
            elif r < 0.80:
                call("step")  # refused with a message when no request waits
            elif r < 0.85 and not run.real:
                call("back")
                call("next")
            elif r < 0.88 and not run.real:
                call("undo")
            elif r < 0.93:
                call("export")
            else:
                call("append", seq, 1)
        out = call("export")
        run.link = out[1] if out else ""
    finally:
        client.close()


def unexpected_exceptions(log: str) -> list[str]:
    """Exception lines in the server log other than refusals (gr.Error / UserError)."""
    exc = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")
    return [line[:200] for line in log.splitlines() if exc.match(line)
            and not line.startswith(("gradio.exceptions.Error", "ui.limits.UserError"))]


def isolation(runs: list[SessionRun]) -> dict[str, Any]:
    """Each session's own log, replayed here, draws what the server last showed that client."""
    from ui.render import render
    from ui.session import Session

    bad = []
    for run in runs:
        if not run.link or run.last_views is None:
            bad.append(f"{run.name}: no link or no views")
            continue
        local = render(Session.from_link(run.link.removeprefix("?trace=")))
        server = run.last_views
        for i, what in ((2, "sequences"), (3, "metrics")):
            if local[i] != server[i]:
                bad.append(f"{run.name}: {what} panel differs from the replay of its own log")
    return {"sessions_checked": len(runs), "mismatches": bad, "ok": not bad}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-sessions", type=int, default=32)
    ap.add_argument("--ops", type=int, default=50)
    ap.add_argument("--real-sessions", type=int, default=4)
    ap.add_argument("--real-ops", type=int, default=16)
    ap.add_argument("--settle", type=float, default=45.0,
                    help="seconds to wait after the clients close before the 'after' reading")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "load.json"))
    ap.add_argument("--room-students", type=int, default=0,
                    help="instead: one classroom room of this many students (bench/room_load.py)")
    ap.add_argument("--room-max-tokens", type=int, default=16)
    ap.add_argument("--room-out", default=os.path.join(ROOT, "bench", "results", "load_room.json"))
    args = ap.parse_args()
    if args.room_students:
        return room_main(args)

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    t0 = time.perf_counter()
    # the server's log (Gradio prints a traceback for each refusal): kept out of bench/results
    log_path = os.path.join(tempfile.gettempdir(), f"pagedlab-load-{port}.server.log")
    log = open(log_path, "w")  # noqa: SIM115 (the server writes to it until it stops)
    proc = launch(["app.py"], port, {}, timeout=300, log=log)
    print(f"[load] app up on {url} in {time.perf_counter() - t0:.1f} s (pid {proc.pid})", flush=True)
    try:
        time.sleep(2)
        rss_start = rss_mb(proc.pid)
        # warm-up: one short session of each mode, closed, so lazy imports and first-call caches
        # are in "before" and the comparison measures what sessions keep
        warm = [SessionRun("warm-dry", False, 12, 999), SessionRun("warm-real", True, 6, 998)]
        barrier = threading.Barrier(len(warm))
        threads = [threading.Thread(target=drive, args=(url, w, barrier)) for w in warm]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(args.settle)
        rss_before = rss_mb(proc.pid)
        print(f"[load] rss at start {rss_start:.0f} MiB, before load {rss_before:.0f} MiB", flush=True)

        runs = [SessionRun(f"dry-{i}", False, args.ops, i) for i in range(args.dry_sessions)]
        runs += [SessionRun(f"real-{i}", True, args.real_ops, 100 + i) for i in range(args.real_sessions)]
        sampler = RssSampler(proc.pid)
        sampler.start()
        barrier = threading.Barrier(len(runs))
        threads = [threading.Thread(target=drive, args=(url, r, barrier)) for r in runs]
        t_load = time.perf_counter()
        cpu0 = psutil.Process(proc.pid).cpu_times()
        me0 = psutil.Process().cpu_times()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        load_s = time.perf_counter() - t_load
        cpu1 = psutil.Process(proc.pid).cpu_times()
        me1 = psutil.Process().cpu_times()
        client_cpu_s = (me1.user - me0.user) + (me1.system - me0.system)
        server_cpu_s = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        rss_end_of_load = rss_mb(proc.pid)
        print(f"[load] {len(runs)} sessions done in {load_s:.1f} s; rss {rss_end_of_load:.0f} MiB",
              flush=True)
        time.sleep(args.settle)
        sampler.stop_flag.set()
        rss_after = rss_mb(proc.pid)
        rss_peak = max(sampler.peak / 2**20, rss_end_of_load)
    finally:
        stop(proc)
        log.close()
        with open(log_path) as f:
            server_log = f.read()

    by_kind: dict[str, list[float]] = {}
    for run in runs:
        for kind, sec in run.latencies:
            by_kind.setdefault(f"{'real' if run.real else 'dry'} {kind}", []).append(sec * 1000)
    latency = {k: {"count": len(v), "p50_ms": round(statistics.median(v), 1),
                   "p95_ms": round(pct(v, 0.95), 1), "max_ms": round(max(v), 1)}
               for k, v in sorted(by_kind.items())}
    errors = [e for r in runs for e in r.errors]
    refusals = [e for r in runs for e in r.refusals]
    iso = isolation(runs)
    result = {
        "what": "bench/load.py: concurrent gradio_client sessions against `python app.py` (real "
                "default model loaded); latency is client-side (queue wait included)",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "sessions": {"dry": args.dry_sessions, "dry_ops_each": args.ops, "dry_pool": "64 blocks x 4",
                     "real": args.real_sessions, "real_ops_each": args.real_ops,
                     "real_pool": "64 blocks x 16 (SmolLM2-135M, + 64 CPU swap blocks)"},
        "load_seconds": round(load_s, 1),
        "operations": sum(len(r.latencies) for r in runs),
        "throughput_ops_per_s": round(sum(len(r.latencies) for r in runs) / load_s, 1),
        # the server's own CPU time per operation; the rest of the 2 cores went to the clients
        "server_cpu_seconds": round(server_cpu_s, 1),
        "server_cpu_ms_per_op": round(1000 * server_cpu_s / max(1, sum(len(r.latencies) for r in runs)), 1),
        # the clients: 36 gradio_client threads in this one Python process (one GIL), decoding
        # every figure the server sends; on 2 cores they compete with the server
        "client_cpu_seconds": round(client_cpu_s, 1),
        "latency_ms": latency,
        "errors": len(errors),
        "error_samples": errors[:10],
        "refusals": len(refusals),
        "refusal_samples": sorted(set(refusals))[:10],
        "rss_mib": {"at_start": round(rss_start, 1), "before": round(rss_before, 1),
                    "peak_during": round(rss_peak, 1), "end_of_load": round(rss_end_of_load, 1),
                    "after": round(rss_after, 1),
                    "after_vs_before_pct": round(100 * (rss_after - rss_before) / rss_before, 1)},
        "memory_back_within_10pct": rss_after <= 1.10 * rss_before,
        "settle_seconds": args.settle,
        "isolation": iso,
        # Gradio logs a traceback for every gr.Error (a refusal); count only the other kinds
        "server_unexpected_exceptions": unexpected_exceptions(server_log),
        "server_log": log_path,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    ok = (not errors and iso["ok"] and result["memory_back_within_10pct"]
          and not result["server_unexpected_exceptions"])
    return 0 if ok else 1


def room_main(args: argparse.Namespace) -> int:
    """One room of --room-students students on the served app (bench/room_load.py)."""
    port = free_port()
    proc = launch(["app.py"], port, {"PAGEDLAB_MAX_ROOM_STUDENTS": str(max(200, args.room_students))},
                  timeout=300)
    try:
        result = run_room(f"http://127.0.0.1:{port}/", proc.pid, args.room_students,
                          max_tokens=args.room_max_tokens)
    finally:
        server_log = stop(proc)
    result["server_unexpected_exceptions"] = unexpected_exceptions(server_log)
    os.makedirs(os.path.dirname(args.room_out), exist_ok=True)
    with open(args.room_out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0 if not result["errors"] and not result["server_unexpected_exceptions"] else 1


if __name__ == "__main__":
    sys.exit(main())
