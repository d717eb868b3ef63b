"""PagedLab as a CPU-basic Space (2 vCPU, 16 GB), simulated: the app served as a Space starts it
(SPACE_ID set, the default model through the hub's code path from a local HF cache, offline)
and VISITORS visitors at once through gradio_client, each on the real model: the page, New sequence,
Append, Add request, Step, Back and Next. Nothing fails, a light click (Back, Next) waits
seconds at worst under the load, and the server's memory is measured while all of them hold an
engine: it grows by no more than the sessions' budget counts them at (twice each pool), far
under what the Space has. The budget is set to hold exactly these: one more visitor is told
what to do instead, and doing it (the dry mode) works. A class of 30 at once is a measurement
(the README's), not a test: `PAGEDLAB_SPACE_VISITORS=30 pytest tests/space/test_cpu_basic_space.py
-s` prints it."""

from __future__ import annotations

import os
import statistics
import threading
import time

import pytest

from bench.measure import RssSampler, pct, rss_mb
from tests.space.conftest import serve, space_env

pytestmark = pytest.mark.slow  # the served app on the real model, several clients
VISITORS = int(os.environ.get("PAGEDLAB_SPACE_VISITORS", "6"))
#: what one default session is counted at: 64 GPU + 64 swap blocks of 16 SmolLM2 tokens
#: (30 layers x 2 x 3 KV heads x 64 x 4 bytes = 45 KiB a token), twice
SESSION_MIB = 2 * 128 * 16 * 46_080 / 2**20
DRY = "dry (bookkeeping only, no model)"


@pytest.fixture(scope="module")
def space(hub_cache, tmp_path_factory):
    budget = str(int(VISITORS * SESSION_MIB + 50))  # the visitors, not one more
    env = space_env(hub_cache, tmp_path_factory.mktemp("cpu-basic"), PAGEDLAB_MEMORY_BUDGET_MB=budget)
    with serve(env) as (url, proc):
        yield url, proc


def visit(url: str, i: int, start: threading.Barrier, seen: dict) -> None:
    """One visitor's clicks, each timed as the visitor waits for it."""
    from gradio_client import Client

    def click(api: str, *args):
        t = time.perf_counter()
        out = client.predict(*args, api_name=api)
        seen["latency"].append((api, time.perf_counter() - t))
        return out

    try:
        client = Client(url, verbose=False, httpx_kwargs={"timeout": 300})
        start.wait()
        click("/on_new", f"Visitor {i} asks about paged memory", False)
        click("/on_append", "0", 2)
        click("/on_add_request", "Paged memory is", 1, 1, 4, 0.0)
        click("/on_step")
        seen["held"].append(True)
        start.wait()  # all of them hold an engine now: the memory is read here
        click("/on_back")
        out = click("/on_next")  # the page's outputs, then the view under the picture
        status = [o for o in out if isinstance(o, str) and "operation" in o]
        assert status and "operation 4 of 4" in status[0], out
        # closing disconnects the session, and the app frees its engine (ui/app.py on_unload):
        # they stay connected until the one too many has been told, or it would find room
        seen["asked"].wait(timeout=300)
        client.close()
    except Exception as err:  # noqa: BLE001 (every failure is reported by the test)
        seen["errors"].append(f"{i}: {type(err).__name__}: {err}")
        start.abort()


def test_visitors_fit_the_memory_budget_and_stay_responsive(space):
    url, proc = space
    from ui.app_process import output

    assert "came from hub: HuggingFaceTB/SmolLM2-135M-Instruct" in output(proc)
    before = rss_mb(proc.pid)
    sampler = RssSampler(proc.pid)
    sampler.start()
    seen: dict = {"latency": [], "errors": [], "held": [], "asked": threading.Event()}
    start = threading.Barrier(VISITORS + 1)
    threads = [threading.Thread(target=visit, args=(url, i, start, seen)) for i in range(VISITORS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    start.wait(timeout=300)  # every visitor connected
    start.wait(timeout=300)  # every visitor holds an engine
    holding = rss_mb(proc.pid)
    try:
        told = one_too_many(url)
    finally:
        seen["asked"].set()
    for t in threads:
        t.join(timeout=300)
    sampler.stop_flag.set()
    took = time.perf_counter() - t0
    assert seen["errors"] == [] and len(seen["held"]) == VISITORS
    light = [s for api, s in seen["latency"] if api in ("/on_back", "/on_next")]
    heavy = [s for api, s in seen["latency"] if api not in ("/on_back", "/on_next")]
    peak = max(sampler.peak / 2**20, holding)
    print(f"\n[cpu basic] {VISITORS} visitors in {took:.0f} s; rss {before:.0f} MiB before, "
          f"{holding:.0f} with all holding an engine, peak {peak:.0f}; Back/Next p50 "
          f"{statistics.median(light):.2f} s p95 {pct(light, 0.95):.2f} s; model clicks p50 "
          f"{statistics.median(heavy):.2f} s p95 {pct(heavy, 0.95):.2f} s")
    assert peak - before <= VISITORS * SESSION_MIB  # what the budget counts them at
    assert peak < 16 * 1024 / 2  # half of CPU basic's 16 GB
    assert pct(light, 0.95) < 10  # a light click never waits long behind the others' model work
    for what in ("MiB", "smaller pool or the dry mode in Settings", "try again in a few minutes"):
        assert what in told["refused"]
    assert "operation 1 of 1" in told["dry"][-1]  # what it said to do works


def one_too_many(url: str) -> dict:
    """One visitor more while the others hold their engines: refused with what to do; then does
    it."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    client = Client(url, verbose=False, httpx_kwargs={"timeout": 300})
    try:
        client.predict("one visitor too many", False, api_name="/on_new")
        refused = ""
    except AppError as err:
        refused = str(err)
    client.predict(DRY, 4, 64, True, api_name="/on_apply")
    dry = client.predict("now in the dry mode", False, api_name="/on_new")
    client.close()
    return {"refused": refused, "dry": dry}
