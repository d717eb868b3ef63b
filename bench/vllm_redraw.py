"""From a vLLM step to PagedLab's redrawn picture (issue 41, target: at most 0.3 s), measured in
the browser: the app watches a real vLLM (`--vllm-events`), Chromium shows its vLLM tab, and
prompts go to vLLM's OpenAI API. vLLM stamps each KV event message at its step (the batch's
`ts`, time.time() in vLLM's engine process); the page records Date.now() in the animation frame
where the tree holding that message is first in the page (a requestAnimationFrame loop reading
the figure's meta, ui/vllm_panel.py). Both clocks are this machine's. A message's latency is
that frame's time minus its stamp: vLLM's publisher, the watch, the timer's wait (TICK_S), the
redraw on the server, the transfer and Plotly's redraw all included. The page is 1280 x 720.

    .venv/bin/python bench/vllm_redraw.py [--prompts 12] [--out bench/results/vllm_redraw.json]

Uses the server PAGEDLAB_VLLM_SERVER names, else starts the local vLLM (engine/vllm/lab.py);
the app runs in dry mode (the tab needs no model of PagedLab's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.vllm import lab  # noqa: E402
from engine.vllm.watch import VllmWatch  # noqa: E402
from ui.app_process import free_port, launch, stop  # noqa: E402
from ui.vllm_panel import TICK_S, TICK_WAIT_S  # noqa: E402

# every animation frame: the vLLM message the tree holds, and when it first held it
RECORDER = """() => { window.pl_seen = []; let last = -1;
  const look = () => { const p = document.querySelector('#vllm-tree .js-plotly-plot');
    const m = p && p._fullLayout && p.layout && p.layout.meta && p.layout.meta.vllm;
    if (m && m.seq !== last) { last = m.seq;
      window.pl_seen.push([m.seq, Date.now() / 1000, m.taken_at, m.drawn_at]); }
    requestAnimationFrame(look); };
  requestAnimationFrame(look); }"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vllm_redraw.json"))
    args = ap.parse_args()
    load = os.getloadavg()
    server = lab.wait(900)  # the one named, or the local one started now
    port = free_port()
    argv = ["app.py", "--dry", "--vllm-events", server.events, "--vllm-replay",
            server.replay or "", "--vllm-url", server.url]
    proc = launch(argv, port, timeout=300)
    try:
        result = measure(f"http://127.0.0.1:{port}/", server, args.prompts)
    finally:
        stop(proc)
    result.update({"load_before": [round(x, 2) for x in load],
                   "load_after": [round(x, 2) for x in os.getloadavg()],
                   "tick_s": TICK_S, "tick_wait_s": TICK_WAIT_S,
                   "machine": f"{os.cpu_count()} cores, shared", "where":
                   "Debian's Chromium at 1280x720: requestAnimationFrame after the tree holding "
                   "the message is in the page, minus vLLM's stamp of the message",
                   "date": time.strftime("%Y-%m-%d %H:%M")})
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


def measure(url: str, server: lab.LabServer, prompts: int) -> dict:
    from playwright.sync_api import sync_playwright

    client, rng = server.client(), random.Random(41)
    stamps: dict[int, float] = {}  # vLLM's message -> its stamp (vLLM's step)
    with VllmWatch(server.events, server.replay, silence_s=60) as watch, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                     args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(url)
        page.wait_for_function("() => (document.querySelector('#vllm-note')?.innerText ?? '')"
                               ".includes('Watching')", timeout=180_000)
        page.evaluate(RECORDER)
        while not watch.joined:
            watch.poll(0.05)
        watch.catch_up()
        first = watch.last_seq + 1
        system = [rng.randrange(1000, 40000) for _ in range(40)]  # a shared start: hits, no store
        for _ in range(prompts):
            prompt = system + [rng.randrange(1000, 40000) for _ in range(rng.choice((30, 60, 100)))]
            client.complete(prompt, max_tokens=8)
            for e in watch.poll(0.5) + watch.catch_up():
                stamps[e.seq] = e.ts
            time.sleep(0.3 + rng.random() * 0.4)  # a pause between prompts, as a person types
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and max(stamps, default=-1) > _seen_max(page):
            time.sleep(0.2)
        seen = page.evaluate("window.pl_seen")
        browser.close()
    return summary(stamps, seen, first)


def summary(stamps: dict[int, float], seen: list, first: int) -> dict:
    """Each message's latency (the first frame showing it, or a later one, minus its stamp),
    and where the time went for the first message each redraw showed."""
    latencies = []
    for seq, ts in sorted(stamps.items()):
        shown = next((at for s, at, *_ in seen if s >= seq), None)
        if seq >= first and shown is not None:
            latencies.append(shown - ts)
    parts, prev = [], first - 1
    for s, at, taken, drawn in seen:
        news = [stamps[q] for q in stamps if prev < q <= s]
        if s >= first and news and None not in (taken, drawn):
            parts.append((taken - min(news), drawn - taken, at - drawn))
        prev = s
    lat = sorted(latencies)

    def pick(q: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(q * len(lat)))], 3) if lat else None

    return {"messages": len([s for s in stamps if s >= first]), "drawn": len(lat),
            "redraws": len(seen),
            "latency_s": {"median": pick(0.5), "p90": pick(0.9),
                          "max": round(max(lat), 3) if lat else None,
                          "mean": round(statistics.mean(lat), 3) if lat else None},
            "parts_median_s": {name: _median([p[i] for p in parts]) for i, name in enumerate(
                ("step_to_watch", "watch_to_figure", "figure_to_frame"))},
            "all_s": [round(x, 3) for x in latencies], "target_s": 0.3,
            "met": bool(lat) and max(lat) <= 0.3}


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def _seen_max(page) -> int:
    seen = page.evaluate("window.pl_seen || []")
    return max((row[0] for row in seen), default=-1)


if __name__ == "__main__":
    main()
