"""Pinned workers (PAGEDLAB_TP_PIN=1): each rank a whole core of its own, the engine the rest."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.tp.cpu_pin import _parse_list, cores, engine_cpus, worker_cpus


def smt(n_cores: int):
    """A machine of n_cores cores with two hyperthreads each, numbered as Linux does: CPU c and
    c + n_cores share core c."""
    return lambda cpu: {cpu % n_cores, cpu % n_cores + n_cores}


def test_sysfs_lists_are_read():
    assert _parse_list("0-3,8\n") == {0, 1, 2, 3, 8}
    assert _parse_list("5") == {5}


def test_each_rank_gets_a_whole_core_and_the_engine_the_others():
    allowed = range(8)  # 4 cores x 2 threads
    assert worker_cpus(2, allowed, smt(4)) == [{3, 7}, {2, 6}]
    assert engine_cpus(2, allowed, smt(4)) == {0, 1, 4, 5}


def test_too_few_cores_pins_nothing():
    assert worker_cpus(2, range(4), smt(2)) is None  # two cores: none left for the engine
    assert engine_cpus(2, range(4), smt(2)) is None


@given(st.integers(1, 16), st.booleans(), st.integers(1, 4))
def test_cores_never_share_a_cpu_and_cover_the_allowed(n_cores, threads, size):
    n = n_cores * (2 if threads else 1)
    of = smt(n_cores) if threads else (lambda c: {c})
    found = cores(range(n), of)
    assert sorted(c for core in found for c in core) == list(range(n))
    workers = worker_cpus(size, range(n), of)
    if workers is None:
        assert len(found) <= size
        return
    mine = [c for w in workers for c in w]
    assert len(mine) == len(set(mine))  # no CPU of two ranks
    assert not set(mine) & engine_cpus(size, range(n), of)
    assert all(frozenset(w) in found for w in workers)  # whole cores


def test_a_worker_and_its_engine_pin_themselves_to_their_cpus(monkeypatch):
    """What the worker and the engine hand Linux: rank 1's one core (not every rank's), and the
    rest (run 5's pinned runs failed here: a list of sets went to sched_setaffinity)."""
    import engine.tp.cpu_pin as pin

    asked = []
    monkeypatch.setattr(pin.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(pin.os, "sched_setaffinity", lambda pid, cpus: asked.append(set(cpus)),
                        raising=False)
    monkeypatch.setattr(pin, "siblings", smt(4))
    assert pin.pin_worker(1, 2) == {2, 6}
    assert pin.pin_engine(2) == {0, 1, 4, 5}
    assert asked == [{2, 6}, {0, 1, 4, 5}]
    assert all(isinstance(c, int) for cpus in asked for c in cpus)
