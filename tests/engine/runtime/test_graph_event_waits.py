"""What the tier's layer-by-layer waits rely on (engine/runtime/tier_copies.py): a CUDA graph
captured with a wait on an external event waits, when replayed, for that event's record made
before the replay was launched, not for one made after it while the graph still sat in the
queue. If it took the later record, a graph queued behind other work could wait for a load
that itself waits for that work: `TierCopies.wait_by_layer` records the events again without
synchronising anything, on the strength of this."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_on_cuda_a_graphs_wait_on_an_external_event_takes_the_record_before_its_launch() -> None:
    ready = torch.cuda.Event(external=True)
    ready.record()  # a capture records a wait only on an event that exists
    x = torch.zeros(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.cuda.current_stream().wait_event(ready)
        x.add_(1)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000)
        ready.record()  # the record the replay should wait for
    torch.cuda._sleep(100_000_000)  # the graph sits in the queue behind this
    graph.replay()
    replayed = torch.cuda.Event()
    replayed.record()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # far longer than the queue ahead of the graph
        ready.record()  # after the launch: not the replay's
    replayed.synchronize()
    assert not side.query(), "the replay waited for a record made after its launch"
    assert x.item() == 1  # a capture runs nothing: the one replay
