"""Kernel benchmark: the paged decode kernel vs torch SDPA (flash), copy_blocks, and swaps.

A benchmark, not a test: it prints a table and writes JSON (and a PNG when matplotlib is
importable). Meant for a GPU (H100, bf16); `--smoke` runs tiny shapes with the torch references
on CPU, to check that the script itself works.

    python bench/kernel_speed.py --out bench/results/kernels.json --png bench/results/kernels.png
    python bench/kernel_speed.py --smoke --out /tmp/kernels.json --png /tmp/kernels.png
    python bench/kernel_speed.py --sweep       # also try decode tile configs on two shapes

What is measured (SmolLM2-135M shapes: 9 query heads, 3 KV heads, head_dim 64):

* Decode (q_len 1, all sequences of equal length) for batch x context. The paged kernel reads
  the cache through an identity block table (sequence i owns consecutive blocks) and through a
  shuffled one (a random permutation of the pool), at block sizes 8, 16 and 32; torch SDPA with
  the flash backend reads contiguous K/V [B, Hkv, L, D] (enable_gqa=True). Every timed call
  reads a different copy of the inputs (>= 30, and enough that all copies together are many
  times the 50 MB L2), so no call is served from L2. Bytes = K + V read once + Q + out + block
  tables; GB/s is compared with the device-to-device copy bandwidth measured in the same run.
* copy_blocks: 256 scattered copy-on-write copies over a full 30-layer cache (one launch).
* swap out / in of 256 blocks vs a plain pinned host <-> device copy of the same byte count.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from paged_kernels import get_kernel_ops, reference  # noqa: E402

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, NUM_LAYERS = 9, 3, 64, 30  # SmolLM2-135M
L2_BYTES = 50e6  # H100 L2
MIN_COPIES = 30


# ---------------------------------------------------------------------------------------------
# Timing


def time_us(fn: Callable[[], object], device: torch.device, reps: int = 20,
            calls: int = 1) -> float:
    """Median device time of one call in microseconds.

    CUDA: `calls` consecutive calls (each reading its own copy of the inputs, so none is served
    from L2) are captured as one CUDA graph, replayed `reps` times between device events; the
    time per call excludes Python launch overhead, as in the engine, whose decode steps are
    graphs too. `do_bench` timed each call alone after zeroing a 256 MB buffer; every shape then
    paid a near-constant ~25 us more (SDPA as well): the flush's dirty L2 lines written back
    during the timed kernel, or host launch time, not the kernel's own work.
    CPU: wall clock.
    """
    if device.type == "cuda":
        for _ in range(3):  # compile, pick algorithms, allocate outside the capture
            fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        spin_up(device)
        us = event_median_us(graph.replay, reps) / calls
        del graph
        return us
    return wall_us(fn, device, reps)


def event_median_us(fn: Callable[[], object], reps: int) -> float:
    """Median of `reps` device-event timings of `fn`, in microseconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def spin_up(device: torch.device, ms: float = 50.0) -> None:
    """Keep the GPU busy for a while: an idle H100 sits at a few hundred MHz (seen: 345 MHz)."""
    x = torch.empty(1 << 26, dtype=torch.float32, device=device)
    t = time.perf_counter()
    while (time.perf_counter() - t) * 1e3 < ms:
        x.mul_(1.0)
        torch.cuda.synchronize()


def wall_us(fn: Callable[[], object], device: torch.device, reps: int = 10) -> float:
    """Median wall time with a device sync: for operations that include host work (swaps)."""
    def synced():
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()

    synced()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        synced()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Device-to-device copy bandwidth in GB/s, bytes read + written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    if device.type != "cuda":
        return 2 * nbytes / time_us(lambda: dst.copy_(src), device) / 1e3
    # Eager, not graph-timed: captured in a graph, this copy becomes a memcpy node that runs on
    # a copy engine (seen: 2428 GB/s in a graph, 3004 GB/s as an ordinary launch).
    for _ in range(3):
        dst.copy_(src)
    spin_up(device)
    return 2 * nbytes / event_median_us(lambda: dst.copy_(src), 10) / 1e3


def host_device_rates(device: torch.device, nbytes: int) -> dict:
    """Pinned host <-> device copy rates in GB/s (one direction's bytes / time)."""
    if device.type != "cuda":
        return {"h2d_GBps": None, "d2h_GBps": None}
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    h2d = wall_us(lambda: dev.copy_(host, non_blocking=True), device)
    d2h = wall_us(lambda: host.copy_(dev, non_blocking=True), device)
    return {"h2d_GBps": nbytes / h2d / 1e3, "d2h_GBps": nbytes / d2h / 1e3}


def free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return 2 << 30  # the smoke run stays small on CPU


def release(device: torch.device) -> None:
    """Hand freed buffers back to the driver, so the next shape's copy count sees them free."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def num_copies(bytes_per_copy: int, device: torch.device, smoke: bool) -> int:
    """>= 30 copies and >= 8x L2 in total; fewer only where memory says so (floor: 4x L2)."""
    if smoke:
        return 4
    want = max(MIN_COPIES, math.ceil(8 * L2_BYTES / bytes_per_copy))
    fit = int(0.6 * free_bytes(device) // bytes_per_copy)
    n = min(want, fit)
    if n * bytes_per_copy < 4 * L2_BYTES:
        print(f"  warning: only {n} copies ({n * bytes_per_copy / 1e6:.0f} MB) fit in memory")
    return max(n, 1)


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


# ---------------------------------------------------------------------------------------------
# Decode


def bench_sdpa(batch: int, context: int, dtype, device, smoke: bool) -> dict:
    """torch SDPA (flash backend where available) over contiguous K/V [B, Hkv, L, D]."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    per_copy = 2 * batch * NUM_KV_HEADS * context * HEAD_DIM * dtype.itemsize
    n = num_copies(per_copy, device, smoke)
    k_all = torch.randn(n * batch, NUM_KV_HEADS, context, HEAD_DIM, dtype=dtype, device=device)
    v_all = torch.randn_like(k_all)
    q = torch.randn(batch, NUM_Q_HEADS, 1, HEAD_DIM, dtype=dtype, device=device)
    state = {"i": 0}

    def call(backend):
        c = state["i"] % n
        state["i"] += 1
        k, v = k_all[c * batch:(c + 1) * batch], v_all[c * batch:(c + 1) * batch]
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    backend_name = "flash"
    try:
        call(SDPBackend.FLASH_ATTENTION)
        backend = SDPBackend.FLASH_ATTENTION
    except RuntimeError as err:  # e.g. CPU builds or dtypes without a flash kernel
        print(f"  SDPA flash unavailable ({str(err).splitlines()[0][:80]}); using math")
        backend, backend_name = SDPBackend.MATH, "math"
    us = time_us(lambda: call(backend), device, calls=n)
    return {"sdpa_us": us, "sdpa_backend": backend_name, "sdpa_copies": n}


def bench_paged(ops, batch: int, context: int, block_size: int, dtype, device, smoke: bool,
                check: bool = True, num_splits: int | None = None) -> dict:
    """The paged kernel over n copies of the batch's cache, identity and shuffled tables."""
    pages = context // block_size
    per_copy_tokens = batch * context
    per_copy = 2 * per_copy_tokens * NUM_KV_HEADS * HEAD_DIM * dtype.itemsize
    n = num_copies(per_copy, device, smoke)
    num_blocks = n * batch * pages
    kv = torch.randn(2, num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM, dtype=dtype,
                     device=device)
    k_cache, v_cache = kv[0], kv[1]
    q = torch.randn(batch, NUM_Q_HEADS, HEAD_DIM, dtype=dtype, device=device)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=device)
    gen = torch.Generator().manual_seed(batch * 7919 + context + block_size)
    tables = {
        "identity": torch.arange(num_blocks, dtype=torch.int32).view(n, batch, pages),
        "shuffled": torch.randperm(num_blocks, generator=gen).to(torch.int32).view(n, batch, pages),
    }
    scale = HEAD_DIM ** -0.5
    result = {"block_size": block_size, "copies": n}
    for kind, table in tables.items():
        table = table.to(device)
        args = dict(seq_lens=seq_lens, query_start_loc=qsl, scale=scale, max_query_len=1,
                    max_seq_len=context, num_splits=num_splits)
        if check:  # the timed configuration, on fresh random data, vs the torch reference
            out = ops.paged_attention(q, k_cache, v_cache, table[0], **args)
            m = min(batch, 16)  # the reference on a subset of the sequences keeps this quick
            ref = reference.paged_attention(q[:m], k_cache, v_cache, table[0, :m],
                                            seq_lens[:m], qsl[:m + 1], scale)
            err = rel_error(out[:m], ref)
            result[f"{kind}_rel_error"] = err
            if err > 1e-2:
                raise AssertionError(f"paged kernel wrong: rel error {err:.3g} ({kind}, "
                                     f"B={batch}, L={context}, bs={block_size})")
        state = {"i": 0}

        def call(table=table, state=state, args=args):
            c = state["i"] % n
            state["i"] += 1
            return ops.paged_attention(q, k_cache, v_cache, table[c], **args)

        result[f"{kind}_us"] = time_us(call, device, calls=n)
    return result


def decode_bytes(batch: int, context: int, itemsize: int, block_size: int | None = None) -> int:
    """Bytes a decode step must move: K + V once, Q, out; the paged kernel adds its metadata
    (block tables, seq_lens, query_start_loc); SDPA (block_size None) has none."""
    nbytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * itemsize
    nbytes += 2 * batch * NUM_Q_HEADS * HEAD_DIM * itemsize
    if block_size is not None:
        nbytes += batch * (context // block_size) * 4 + (2 * batch + 1) * 4
    return nbytes


def run_decode(ops, batches, contexts, block_sizes, dtype, device, smoke, copy_bw) -> list[dict]:
    rows = []
    for context in contexts:
        for batch in batches:
            sdpa = bench_sdpa(batch, context, dtype, device, smoke)
            release(device)
            sdpa_bytes = decode_bytes(batch, context, dtype.itemsize)
            for block_size in block_sizes:
                paged = bench_paged(ops, batch, context, block_size, dtype, device, smoke)
                release(device)
                nbytes = decode_bytes(batch, context, dtype.itemsize, block_size)
                row = {"batch": batch, "context": context, **paged, **sdpa, "bytes": nbytes}
                for kind in ("identity", "shuffled"):
                    gbps = nbytes / row[f"{kind}_us"] / 1e3
                    row[f"{kind}_GBps"] = gbps
                    row[f"{kind}_frac_copy_bw"] = gbps / copy_bw
                row["sdpa_GBps"] = sdpa_bytes / row["sdpa_us"] / 1e3
                row["sdpa_frac_copy_bw"] = row["sdpa_GBps"] / copy_bw
                # < 1 means the paged kernel is faster than SDPA on contiguous K/V.
                row["paged_over_sdpa"] = row["shuffled_us"] / row["sdpa_us"]
                row["shuffled_over_identity"] = row["shuffled_us"] / row["identity_us"]
                rows.append(row)
                print(f"{batch:5d} {context:6d} {block_size:3d} {row['copies']:5d}"
                      f" {row['identity_us']:9.1f} {row['shuffled_us']:9.1f}"
                      f" {row['sdpa_us']:9.1f} {row['shuffled_GBps']:8.0f}"
                      f" {row['shuffled_frac_copy_bw']:6.2f} {row['paged_over_sdpa']:6.2f}"
                      f" {row['shuffled_over_identity']:6.2f}", flush=True)
    return rows


def sweep_decode(ops, dtype, device) -> list[dict]:
    """Try decode tile configs (block_n, num_warps, num_stages) on two shapes, block size 16."""
    from paged_kernels import paged_attention as pa

    results = []
    for batch, context in [(32, 2048), (256, 2048)]:
        for block_n in (32, 64, 128):
            for num_warps in (2, 4, 8):
                for num_stages in (2, 3, 4):
                    pa.CONFIG_OVERRIDE = dict(block_n=block_n, num_warps=num_warps,
                                              num_stages=num_stages)
                    try:
                        r = bench_paged(ops, batch, context, 16, dtype, device, False, check=True)
                    except Exception as err:  # a config may not compile (shared memory)
                        print(f"  sweep B={batch} L={context} {pa.CONFIG_OVERRIDE}: {err}")
                        continue
                    finally:
                        pa.CONFIG_OVERRIDE = None
                    release(device)
                    r.update(batch=batch, context=context, block_n=block_n,
                             num_warps=num_warps, num_stages=num_stages)
                    results.append(r)
                    print(f"  sweep B={batch} L={context} block_n={block_n} warps={num_warps}"
                          f" stages={num_stages}: {r['shuffled_us']:.1f} us", flush=True)
    return results


def sweep_splits(ops, dtype, device) -> list[dict]:
    """Split-K counts (and two tile configs) on the mid-size shapes where the heuristic's choice
    matters most: the grid of batch x KV heads programs is smaller than the GPU there."""
    from paged_kernels import paged_attention as pa

    results = []
    configs = [None, dict(block_n=128, num_warps=8), dict(num_stages=3), dict(num_stages=4),
               dict(num_warps=2), dict(block_n=32)]
    for batch, context in [(32, 2048), (64, 2048), (128, 2048), (32, 8192), (64, 8192)]:
        for config in configs:
            for splits in (1, 2, 3, 4, 6, 8) if config is None else (2, 3, 4, 6):
                pa.CONFIG_OVERRIDE = config
                try:
                    r = bench_paged(ops, batch, context, 16, dtype, device, False, check=True,
                                    num_splits=splits)
                except Exception as err:
                    print(f"  splits B={batch} L={context} {config} x{splits}: {err}")
                    continue
                finally:
                    pa.CONFIG_OVERRIDE = None
                release(device)
                r.update(batch=batch, context=context, num_splits=splits, config=config,
                         heuristic=pa.choose_num_splits(batch, NUM_KV_HEADS, context, 64, device))
                results.append(r)
                print(f"  splits B={batch} L={context} {config or 'default'} x{splits}: "
                      f"{r['shuffled_us']:.1f} us (heuristic x{r['heuristic']})", flush=True)
    return results


# ---------------------------------------------------------------------------------------------
# copy_blocks and swaps


def bench_cache_ops(ops, dtype, device, smoke: bool, copy_bw: float) -> dict:
    layers, num_blocks, block_size, moved = (2, 64, 16, 16) if smoke else (NUM_LAYERS, 4096, 16,
                                                                          256)
    kv = torch.randn(layers, 2, num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM, dtype=dtype,
                     device=device)
    block_bytes = layers * 2 * block_size * NUM_KV_HEADS * HEAD_DIM * dtype.itemsize
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(num_blocks, generator=gen)
    src, dst = perm[:moved].to(device), perm[moved:2 * moved].to(device)

    before = kv[:, :, src].clone()
    ops.copy_blocks(kv, src, dst)
    assert torch.equal(kv[:, :, dst], before), "copy_blocks wrong"
    # Timed over every disjoint (src, dst) set the pool holds, in turn, so no call finds its
    # blocks in L2 from the call before.
    sets = [(perm[i:i + moved].to(device), perm[i + moved:i + 2 * moved].to(device))
            for i in range(0, num_blocks - 2 * moved + 1, 2 * moved)]
    turn = {"i": 0}

    def rotating(copy):
        def call():
            s, d = sets[turn["i"] % len(sets)]
            turn["i"] += 1
            copy(kv, s, d)
        return call

    copy_us = time_us(rotating(ops.copy_blocks), device, calls=len(sets))
    ref_us = time_us(rotating(reference.copy_blocks), device, calls=len(sets))
    moved_bytes = 2 * moved * block_bytes  # read + write
    out = {
        "copy_blocks": {
            "blocks": moved, "layers": layers, "block_size": block_size, "bytes_rw": moved_bytes,
            "rotating_sets": len(sets),
            "us": copy_us, "GBps": moved_bytes / copy_us / 1e3,
            "frac_copy_bw": moved_bytes / copy_us / 1e3 / copy_bw,
            "torch_index_copy_us": ref_us,
        }
    }

    pin = device.type == "cuda"
    host = torch.zeros((layers, 2, 2 * moved) + kv.shape[3:], dtype=dtype, pin_memory=pin)
    host_ids = torch.randperm(2 * moved, generator=gen)[:moved]
    ops.swap_blocks(kv, host, src, host_ids)
    if device.type == "cuda":
        torch.cuda.synchronize()  # the swap kernel writes pinned host memory asynchronously
    assert torch.equal(host[:, :, host_ids], kv[:, :, src].cpu()), "swap out wrong"
    out_us = wall_us(lambda: ops.swap_blocks(kv, host, src, host_ids), device)
    in_us = wall_us(lambda: ops.swap_blocks(host, kv, host_ids, dst), device)
    payload = moved * block_bytes
    rates = host_device_rates(device, payload)
    out["swap"] = {
        "blocks": moved, "bytes": payload,
        "out_us": out_us, "out_GBps": payload / out_us / 1e3,
        "in_us": in_us, "in_GBps": payload / in_us / 1e3, **rates,
    }
    if rates["d2h_GBps"]:
        out["swap"]["out_frac_of_d2h"] = out["swap"]["out_GBps"] / rates["d2h_GBps"]
        out["swap"]["in_frac_of_h2d"] = out["swap"]["in_GBps"] / rates["h2d_GBps"]
    return out


# ---------------------------------------------------------------------------------------------
# Output


def plot(results: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib not importable: skipping the plot {path}")
        return
    rows = [r for r in results["decode"] if r["block_size"] == results["config"]["block_size"]]
    contexts = sorted({r["context"] for r in rows})
    fig, axes = plt.subplots(1, len(contexts), figsize=(5 * len(contexts), 4), squeeze=False)
    for ax, context in zip(axes[0], contexts, strict=True):
        sel = sorted((r for r in rows if r["context"] == context), key=lambda r: r["batch"])
        batches = [r["batch"] for r in sel]
        for key, label in [("shuffled_GBps", "paged, shuffled table"),
                           ("identity_GBps", "paged, identity table"),
                           ("sdpa_GBps", "SDPA (contiguous)")]:
            ax.plot(batches, [r[key] for r in sel], marker="o", label=label)
        ax.axhline(results["copy_bandwidth_GBps"], color="grey", ls="--", label="copy bandwidth")
        ax.set_xscale("log", base=2)
        ax.set_title(f"decode, context {context}")
        ax.set_xlabel("batch")
        ax.set_ylabel("GB/s")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{results['device']} {results['dtype']} block size "
                 f"{results['config']['block_size']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, torch references, CPU")
    ap.add_argument("--out", default="bench/results/kernels.json")
    ap.add_argument("--png", default="bench/results/kernels.png")
    ap.add_argument("--batches", type=int, nargs="+", default=None)
    ap.add_argument("--contexts", type=int, nargs="+", default=None)
    ap.add_argument("--block-sizes", type=int, nargs="+", default=None)
    ap.add_argument("--sweep", action="store_true", help="also sweep decode tile configs")
    ap.add_argument("--split-sweep", action="store_true", help="also sweep split-K counts")
    ap.add_argument("--only-cache-ops", action="store_true",
                    help="skip the decode table (copy_blocks and swaps only)")
    args = ap.parse_args(argv)

    if args.smoke:
        device, dtype = torch.device("cpu"), torch.float32
        ops = get_kernel_ops(device, "reference")
        batches, contexts, block_sizes = [1, 2], [32, 64], [16, 8]
        bw_bytes = 64 << 20
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --smoke for the CPU check of this script")
        device, dtype = torch.device("cuda"), torch.bfloat16
        ops = get_kernel_ops(device)
        batches, contexts, block_sizes = [1, 8, 32, 64, 256], [512, 2048, 8192], [16, 8, 32]
        bw_bytes = 1 << 30
    batches = args.batches or batches
    contexts = args.contexts or contexts
    block_sizes = args.block_sizes or block_sizes
    torch.manual_seed(0)

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu {platform.machine()} x{os.cpu_count()}"
    copy_bw = copy_bandwidth(device, bw_bytes)
    print(f"device {name}, kernels {ops.name}, {dtype}; copy bandwidth {copy_bw:.0f} GB/s")
    print(f"{'batch':>5} {'ctx':>6} {'bs':>3} {'copies':>5} {'ident_us':>9} {'shuf_us':>9}"
          f" {'sdpa_us':>9} {'GB/s':>8} {'of_bw':>6} {'/sdpa':>6} {'shuf/id':>6}")
    decode = [] if args.only_cache_ops else run_decode(ops, batches, contexts, block_sizes, dtype,
                                                        device, args.smoke, copy_bw)
    cache = bench_cache_ops(ops, dtype, device, args.smoke, copy_bw)
    cb, sw = cache["copy_blocks"], cache["swap"]
    print(f"copy_blocks: {cb['blocks']} blocks x {cb['layers']} layers in {cb['us']:.1f} us "
          f"({cb['GBps']:.0f} GB/s, {cb['frac_copy_bw']:.2f} of copy bw; torch index_copy "
          f"{cb['torch_index_copy_us']:.1f} us)")
    print(f"swap {sw['blocks']} blocks ({sw['bytes'] / 1e6:.1f} MB): out {sw['out_us']:.0f} us "
          f"({sw['out_GBps']:.1f} GB/s), in {sw['in_us']:.0f} us ({sw['in_GBps']:.1f} GB/s); "
          f"pinned d2h {sw['d2h_GBps'] or 0:.1f} GB/s, h2d {sw['h2d_GBps'] or 0:.1f} GB/s")

    results = {
        "device": name, "torch": torch.__version__, "dtype": str(dtype).replace("torch.", ""),
        "kernels": ops.name, "smoke": args.smoke,
        "triton": _triton_version(),
        "config": {"num_q_heads": NUM_Q_HEADS, "num_kv_heads": NUM_KV_HEADS,
                   "head_dim": HEAD_DIM, "block_size": block_sizes[0],
                   "block_sizes": block_sizes, "min_copies": MIN_COPIES, "l2_bytes": L2_BYTES},
        "copy_bandwidth_GBps": copy_bw,
        "decode": decode, **cache,
    }
    if args.sweep and device.type == "cuda":
        results["sweep"] = sweep_decode(ops, dtype, device)
    if args.split_sweep and device.type == "cuda":
        results["split_sweep"] = sweep_splits(ops, dtype, device)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}")
    if args.png and decode:
        plot(results, args.png)
    return results


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


if __name__ == "__main__":
    main()
