"""Is an engine's host slower in some processes than in others, and is it torch's own threads?

    python bench/host_speed.py --out "$OUT/host_speed.json"        # one GPU: ~40 s a process
    OMP_NUM_THREADS=1 python bench/host_speed.py --out "$OUT/host_speed_omp1.json"
    python bench/host_speed.py --smoke --out /tmp/host_speed.json

Run 17 measured the 1.2B roofline engine at 256 sequences at 2.88 ms a step in one process and
4.79 in the next, the same code; cProfile showed every host function, `len` included, about 1.9x
slower in the slow one, the same calls. This makes the roofline's engine `--engines` times in
one process and, for each, around its steady decode steps:

- `python_ms`: a fixed pure-Python loop timed just before the steps (the host's speed now);
- `step_ms`: the steady step (median, as `device_step.mid_run`);
- `main_cpu_over_wall`: the main thread's CPU time over the wall time of the steps (below 1:
  it waited, for the device or for a core);
- `other_threads_cpu_s`: the CPU seconds the process's other threads (torch's intra-op pool,
  CUDA's) used during the steps: a pool that spins keeps cores busy, and a core it shares with
  the main thread (two hyperthreads of one core) runs the engine at about half speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import device_step, mem_models  # noqa: E402
from bench import hybrid as prompts_of  # noqa: E402
from engine import SamplingParams  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def gpu_interrupts() -> list[int]:
    """The GPU driver's interrupts so far, per CPU (/proc/interrupts' nvidia lines; [] if none)."""
    try:
        with open("/proc/interrupts") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    cpus = len(lines[0].split())
    per_cpu = [0] * cpus
    for line in lines[1:]:
        if "nvidia" in line:
            for i, v in enumerate(line.split()[1:cpus + 1]):
                per_cpu[i] += int(v) if v.isdigit() else 0
    return per_cpu


def steal_ticks() -> list[int]:
    """Each CPU's stolen time so far (/proc/stat: time the hypervisor ran something else while
    this VM's CPU wanted to run), in clock ticks."""
    with open("/proc/stat") as f:
        return [int(line.split()[8]) for line in f if line.startswith("cpu") and line[3].isdigit()]


def pin(mode: str | None) -> int | None:
    """Pin this thread to one CPU: the one that took the most GPU interrupts so far ("irq"),
    or one that took none ("away"); None: leave it to the OS."""
    if mode is None:
        return None
    irqs = gpu_interrupts()
    if not irqs:
        return None
    cpu = max(range(len(irqs)), key=irqs.__getitem__) if mode == "irq" else \
        next((c for c in range(len(irqs) - 1, -1, -1) if irqs[c] == 0), 0)
    os.sched_setaffinity(0, {cpu})
    return cpu


def python_ms() -> float:
    """A fixed pure-Python loop (dict, list and int work, as the scheduler's), best of 5."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        d: dict[int, list[int]] = {}
        for i in range(20000):
            d.setdefault(i & 255, []).append(len(d) + i)
        best = min(best, time.perf_counter() - t0)
    return round(1e3 * best, 3)


def thread_cpu_s() -> dict[int, float]:
    """Each thread of this process: its CPU seconds so far (user + system)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICKS
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return out


def one_engine(path: str, device: str, n: int, plen: int, new: int, pin_mode: str | None) -> dict:
    eng = device_step.engine(path, device, 0, n, n * -(-(plen + new) // 16) + 64)  # the roofline's
    prompts = prompts_of._prompts(n, plen, plen, n)
    eng.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))
    pinned = pin(pin_mode)
    speed = python_ms()
    irq0, steal0 = gpu_interrupts(), steal_ticks()
    main = threading.get_native_id()
    cpu0, wall0, main0 = thread_cpu_s(), time.perf_counter(), time.thread_time()
    at = time.time()  # to line the steps up with bench/host_cpus.py's samples
    walls = device_step._steady_walls(eng, prompts, SamplingParams(max_tokens=new, ignore_eos=True))
    cpu1, wall = thread_cpu_s(), time.perf_counter() - wall0
    irqs = [b - a for a, b in zip(irq0, gpu_interrupts(), strict=False)]
    steal = [b - a for a, b in zip(steal0, steal_ticks(), strict=True)]
    main_cpu = time.thread_time() - main0
    eng.close()
    others = sum(cpu1[t] - cpu0.get(t, 0.0) for t in cpu1 if t != main)
    return {"python_ms": speed, "python_ms_after": python_ms(), "step_ms": device_step._median_ms(walls),
            "steady_steps": len(walls), "main_cpu_over_wall": round(main_cpu / wall, 3),
            "other_threads_cpu_s": round(others, 3), "wall_s": round(wall, 3),
            "threads": len(cpu1), "torch_threads": torch.get_num_threads(),
            "on_cpu": _current_cpu(), "pinned_to": pinned, "steps_from_to": [at, at + wall],
            "gpu_interrupts_during_steps": {c: v for c, v in enumerate(irqs) if v},
            "steal_ticks_during_steps": {c: v for c, v in enumerate(steal) if v}}


def _current_cpu() -> int | None:
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--pin", choices=["irq", "away"], default=None,
                    help="the main thread on the CPU that takes the GPU's interrupts, or off it")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sizes = device_step.SMOKE if args.smoke else device_step.FULL
    n = 4 if args.smoke else args.seqs
    tok, _ = mem_models.tokenizer()
    path = mem_models.build("one_b", Path(tempfile.mkdtemp(prefix="host-speed-")), tok, args.device,
                            2 if args.smoke else None)
    out: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                 "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "seqs": n, "pin": args.pin,
                 "python_ms_at_start": python_ms(), "engines": []}
    for _ in range(args.engines):
        out["engines"].append(one_engine(path, args.device, n, sizes["roof_prompt"], sizes["roof_new"],
                                      args.pin))
        print(json.dumps(out["engines"][-1]), flush=True)
    out["step_ms_median"] = statistics.median(e["step_ms"] for e in out["engines"])
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
