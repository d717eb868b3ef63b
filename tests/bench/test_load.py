"""bench/load.py in small: concurrent gradio_client sessions on one served app (4 dry x 10
operations and 1 on the real default model), no errors, and every session's last view equals
the replay of its own exported log (no cross-talk). The full run is `python bench/load.py`."""

from __future__ import annotations

import threading

import pytest

from bench.load import SessionRun, drive, isolation
from engine import ops


@pytest.mark.slow
def test_concurrent_sessions_have_no_errors_and_stay_isolated(served_app) -> None:
    runs = [SessionRun(f"dry-{i}", False, 10, i) for i in range(4)]
    runs.append(SessionRun("real-0", True, 4, 100))
    barrier = threading.Barrier(len(runs))
    threads = [threading.Thread(target=drive, args=(served_app, r, barrier)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads)
    errors = [e for r in runs for e in r.errors]
    assert errors == []
    for r in runs:
        assert len(r.latencies) >= r.ops  # every operation answered
        assert all("something went wrong" not in m for m in r.refusals)
    iso = isolation(runs)
    assert iso["ok"], iso["mismatches"]
    assert iso["sessions_checked"] == 5


def test_closing_a_session_frees_its_engine_at_once() -> None:
    """What the app's unload handler relies on: the engine (and its KV pool) is gone after
    close(), without waiting for Python's occasional full garbage collection."""
    import weakref

    from engine import EngineConfig
    from ui.session import Session, live_sessions

    s = Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=16))
    s.run(ops.AddSequence("abc"))
    engine = weakref.ref(s.engine)
    held = live_sessions()
    s.close()
    assert engine() is None and live_sessions() == held - 1
    s.run(ops.Append(0, n=1))  # a closed session that comes back replays its log
    assert len(s.ops) == 2
    s.close()
