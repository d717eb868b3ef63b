"""The CPU tier's copies (engine/runtime/tier_copies.py): a slot is one contiguous run of bytes
holding a block's K/V of every layer; an offload and a load move exactly a block's bytes, bit
for bit, whatever other blocks and slots hold; and in serving, a request whose prefix comes back
from the tier waits one step ("loading") while the bytes come in, then computes only the rest."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core import scheduler
from engine.runtime.tier_copies import TierCopies, _runs, take_loads


def pool(blocks: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn((3, 2, blocks, 4, 2, 8), generator=g)  # [layers, k/v, blocks, bs, heads, d]


def test_a_slot_holds_a_blocks_every_layer_one_contiguous_run_a_layer_part() -> None:
    kv = pool()
    tier = TierCopies(kv, 5)
    assert (tier.parts, tier.part_layers) == (3, 1)  # 3 layers: a part each
    tier.offload(kv, [(7, 2), (3, 3), (9, 0)])
    for block, slot in [(7, 2), (3, 3), (9, 0)]:
        assert all(tier.slots[part, slot].is_contiguous() for part in range(3))
        assert torch.equal(tier.read(slot), kv[:, :, block])  # bit for bit
    assert tier.slot_bytes == 3 * 2 * 4 * 2 * 8 * 4


@pytest.mark.parametrize("layers, parts", [(16, 4), (30, 3), (2, 2), (7, 1)])
def test_a_slot_is_cut_into_the_most_layer_parts_up_to_four_that_divide_the_layers(
        layers: int, parts: int, monkeypatch) -> None:
    monkeypatch.delenv("PAGEDLAB_TIER_PARTS", raising=False)
    kv = torch.randn((layers, 2, 6, 4, 2, 8))
    tier = TierCopies(kv, 4)
    assert tier.parts == parts and tier.slots.shape[:3] == (parts, 4, layers // parts)
    tier.offload(kv, [(5, 1), (0, 3)])
    before = kv.clone()
    kv.zero_()
    tier.load(kv, [(1, 2), (3, 4)])
    assert torch.equal(kv[:, :, 2], before[:, :, 5]) and torch.equal(kv[:, :, 4], before[:, :, 0])
    assert tier.layer_waits(list(range(layers))) is None  # a CPU: no pass waits by part


def test_the_parts_can_be_chosen_and_a_count_that_does_not_divide_the_layers_is_refused(
        monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLAB_TIER_PARTS", "1")
    assert TierCopies(torch.zeros((16, 2, 6, 4, 2, 8)), 4).parts == 1
    monkeypatch.setenv("PAGEDLAB_TIER_PARTS", "5")
    with pytest.raises(ValueError, match="PAGEDLAB_TIER_PARTS=5 must be >= 1 and divide the "
                                         "model's 16 layers"):
        TierCopies(torch.zeros((16, 2, 6, 4, 2, 8)), 4)


def test_a_load_writes_exactly_its_blocks() -> None:
    kv = pool()
    tier = TierCopies(kv, 5)
    tier.offload(kv, [(1, 4), (2, 3)])
    before = kv.clone()
    tier.load(kv, [(4, 10), (3, 6)])
    assert torch.equal(kv[:, :, 10], before[:, :, 1]) and torch.equal(kv[:, :, 6], before[:, :, 2])
    untouched = [b for b in range(12) if b not in (6, 10)]
    assert torch.equal(kv[:, :, untouched], before[:, :, untouched])


def test_consecutive_slots_go_in_one_copy() -> None:
    assert _runs([3, 4, 5, 9, 10, 2]) == [(3, 6, 0), (9, 11, 3), (2, 3, 5)]
    assert _runs([0]) == [(0, 1, 0)]
    assert _runs(list(range(20, 148))) == [(20, 148, 0)]  # a prefix's slots: one copy
    assert _runs([3, 3, 4]) == [(3, 4, 0), (3, 5, 1)]  # a slot twice (two loads of it): not one run
    assert _runs([]) == []


def test_a_forward_waits_once_for_each_load_that_writes_a_block_it_reads() -> None:
    """A step's tables hold many blocks and the loads in flight few: the loads that write any
    block read are found (each once, however many of its blocks are read) and forgotten; the
    others stay pending for the step that reads them."""
    first, second = object(), object()
    pending = {40: first, 41: first, 42: first, 90: second}
    got = take_loads(pending, set(range(0, 41)) | {None})
    assert got == [first] and pending == {90: second}
    assert take_loads(pending, [1, 2, 3]) == [] and pending == {90: second}
    assert take_loads(pending, (90,)) == [second] and pending == {}


DEVICE = "cuda"  # the tests below that need a GPU run there
SYSTEM = "You are a helpful assistant who answers questions about geography in one short sentence. "


def test_a_prefix_from_the_tier_waits_one_step_beside_others_and_none_alone() -> None:
    """Dry mode (the bookkeeping is the same with a model): beside a decoding request, the
    request that hits the tier is 'loading' in the step its blocks come back, computes nothing
    then (the other's pass must not wait for the bus), and prefills the rest of its prompt in
    the next step; alone, it loads and computes the rest in one step (nobody's pass waits but
    its own). Either way it computes only the rest, with the tokens of recomputing it, and
    every sequence reads back its own K/V (content tracked)."""
    params = SamplingParams(max_tokens=4, seed=3, temperature=0.8)

    def serve(tier: int, beside: bool) -> tuple[list, list, list]:
        """The outputs, then for each step of the request: did it load, its prefill's (computed,
        cached) or None, its status after the step."""
        eng = LLMEngine(EngineConfig(model=None, block_size=8, num_gpu_blocks=18,
                                     num_offload_blocks=tier, track_kv_content=True))
        eng.generate(SYSTEM + "France?", params)
        eng.generate("x" * 100, params)  # pushes the system prompt's blocks into the tier
        if beside:
            eng.add_request("yz", SamplingParams(max_tokens=12, ignore_eos=True))
            eng.step()
        rid = eng.add_request(SYSTEM + "Spain?", params)
        seq = eng.request(rid).live_seq_ids[0]
        outs, steps = [], []
        while eng.has_pending_work():
            res = eng.step()
            eng.check_invariants()
            outs += [(o.request_id, o.outputs[0].token_ids) for o in res.finished]
            prefill = [(e.facts.computed, e.facts.cached) for e in res.events
                       if e.kind == "prefill" and e.seq_id == seq]
            steps.append((any(e.kind == "load" for e in res.events), prefill[0] if prefill else None,
                          eng.request(rid).status if eng.request(rid) else "finished"))
        return sorted(outs), steps

    prompt = LLMEngine(EngineConfig(model=None)).encode(SYSTEM + "Spain?")
    for beside in (True, False):
        plain, _ = serve(0, beside)
        got, steps = serve(32, beside)
        assert got == plain  # the tokens of recomputing the prefix
        assert [i for i, (load, _, _) in enumerate(steps) if load] == [0]  # all in its first step
        prefills = [(i, p) for i, (_, p, _) in enumerate(steps) if p is not None]
        (at, (computed, cached)), = prefills
        assert cached >= 8 * 8 and computed == len(prompt) - cached  # only the rest
        if beside:  # it waits a step: the other's pass does not wait for the bus
            assert at == 1 and steps[0][2] == "loading" and steps[1][2] != "loading"
        else:
            assert at == 0 and all(status != "loading" for _, _, status in steps)


def test_beside_other_requests_a_long_prefix_comes_back_a_few_blocks_a_step(monkeypatch) -> None:
    """While another request decodes, the prompt whose prefix is in the tier takes at most
    TIER_LOAD_CHUNK blocks from it a step (its bookkeeping and copies spread over the others'
    steps), computes nothing until the step after its last blocks came, and gives the tokens
    of the engine without a tier; alone, it takes all of them at once. Content tracked."""
    monkeypatch.setattr(scheduler, "TIER_LOAD_CHUNK", 3)

    def serve(tier: int) -> tuple[list, list[int], list[bool]]:
        eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=40,
                                     num_offload_blocks=tier, seed=5))
        params = SamplingParams(max_tokens=6)
        outs = [eng.generate(SYSTEM + "France?", params)[0], eng.generate("x" * 130, params)[0]]
        other = eng.add_request("yz" * 6, SamplingParams(max_tokens=30, ignore_eos=True))
        eng.step()
        rid = eng.add_request(SYSTEM + "Spain?", params)
        loaded, decoding = [], []
        while eng.has_pending_work():
            res = eng.step()
            outs += res.finished
            loaded += [len(e.block_ids) for e in res.events if e.kind == "load"]
            if any(o.request_id == rid for o in res.finished):
                continue
            if eng.request(rid) and eng.request(rid).status == "loading":
                decoding.append(res.num_decodes > 0 and eng.request(other) is not None)
            eng.check_invariants()
        assert (sum(loaded) >= 3 * len(SYSTEM) // 16) == bool(tier)
        return sorted((o.request_id, o.outputs[0].token_ids) for o in outs), loaded, decoding

    plain, _, _ = serve(0)
    got, loaded, decoding = serve(64)
    assert got == plain
    assert len(loaded) >= 3 and max(loaded) <= 3  # over several steps, 3 blocks each at most
    assert decoding and all(decoding)  # the other request decoded in every step of the load
    alone = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=40,
                                   num_offload_blocks=64))
    alone.generate(SYSTEM + "France?", SamplingParams(max_tokens=6))
    alone.generate("x" * 130, SamplingParams(max_tokens=6))
    alone.add_request(SYSTEM + "Spain?", SamplingParams(max_tokens=6))
    first = alone.step()
    assert sum(len(e.block_ids) for e in first.events if e.kind == "load") > 3  # all at once


def test_a_load_in_parts_whose_neighbour_ends_takes_the_rest_and_computes_in_that_step(
        monkeypatch) -> None:
    """A prompt loading its prefix 3 blocks a step beside a short request: once that request
    has finished, nothing else runs, so the next step takes all the blocks left and computes
    the prompt's rest in that same step, with the tokens of recomputing it (content tracked)."""
    monkeypatch.setattr(scheduler, "TIER_LOAD_CHUNK", 3)

    def serve(tier: int) -> tuple[list, list[tuple[int, bool]]]:
        eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=40,
                                     num_offload_blocks=tier, seed=5, track_kv_content=True))
        params = SamplingParams(max_tokens=6)
        outs = [eng.generate(SYSTEM + "France?", params)[0], eng.generate("x" * 130, params)[0]]
        eng.add_request("yz", SamplingParams(max_tokens=3, ignore_eos=True))
        eng.step()
        rid = eng.add_request(SYSTEM + "Spain?", params)
        seq = eng.request(rid).live_seq_ids[0]
        steps = []  # (blocks loaded, did the request prefill) per step
        while eng.has_pending_work():
            res = eng.step()
            eng.check_invariants()
            outs += res.finished
            steps.append((sum(len(e.block_ids) for e in res.events if e.kind == "load"),
                          any(e.kind == "prefill" and e.seq_id == seq for e in res.events)))
        return sorted((o.request_id, o.outputs[0].token_ids) for o in outs), steps

    plain, _ = serve(0)
    got, steps = serve(64)
    assert got == plain
    loading = [(n, pre) for n, pre in steps if n]
    assert len(loading) >= 2 and all(n <= 3 for n, _ in loading[:-1])  # in parts beside it
    assert loading[-1][0] > 3 and loading[-1][1]  # then the rest at once, computed in that step
    assert not any(pre for _, pre in loading[:-1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_copies_run_on_their_streams_and_move_the_same_bytes() -> None:
    kv = pool(64).to("cuda", torch.bfloat16)
    tier = TierCopies(kv, 40)
    before = kv.clone()
    tier.offload(kv, [(b, b) for b in range(20)])  # the gather on this stream, the DMA on its own
    kv[:, :, :20] = 0  # the new owners write right away: the gather read before them
    tier.load(kv, [(s, 40 + s) for s in range(20)])  # high-priority stream, after the offload
    tier.wait_for_blocks(list(range(40, 60)))
    torch.cuda.synchronize()
    assert torch.equal(kv[:, :, 40:60], before[:, :, :20])
    assert all(torch.equal(tier.read(s), before[:, :, s].cpu()) for s in range(20))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_loads_queued_back_to_back_share_one_staging_buffer_and_bring_their_own_bytes() -> None:
    """Three loads with no wait between them, the second larger than the buffer (it grows):
    each brings its own slots' bytes (the next load's copy into the buffer waits for the last
    one's scatter out of it), and once grown, a load takes no device memory."""
    kv = pool(160).to("cuda", torch.bfloat16)
    tier = TierCopies(kv, 80)
    before = kv.clone()
    tier.offload(kv, [(b, b) for b in range(80)])
    tier.load(kv, [(s, 80 + s) for s in range(10)])
    tier.load(kv, [(s, 80 + s) for s in range(10, 50)])  # 40 slots: past the first 32
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    tier.load(kv, [(s, 80 + s) for s in range(50, 60)])
    assert torch.cuda.max_memory_allocated() - held < 10 * tier.slot_bytes  # its block ids only
    tier.wait_for_blocks(list(range(80, 140)))
    torch.cuda.synchronize()
    assert torch.equal(kv[:, :, 80:140], before[:, :, :60])
    assert torch.equal(kv[:, :, 140:], before[:, :, 140:])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_loads_fetched_ahead_of_the_offloads_of_their_blocks_keep_both_bytes() -> None:
    """A long prefix's step: the bus copy of its loads starts first (`fetch_ahead`), then the
    blocks it will write are offloaded (their old bytes), then its loads land, in two calls
    (into free blocks, into the evicted ones; one of slots not next to each other). Each side
    gets its own bytes. A fetched slot written before its load reads its new bytes."""
    kv = pool(96).to("cuda", torch.bfloat16)
    tier = TierCopies(kv, 48)
    before = kv.clone()
    tier.offload(kv, [(b, b) for b in range(20)])  # slots 0-19: the prefix, evicted earlier
    tier.fetch_ahead(list(range(20)))
    tier.offload(kv, [(40 + b, 20 + b) for b in range(15)])  # the blocks it evicts now
    tier.load(kv, [(s, 60 + s) for s in (0, 2, 4, 6, 8)])  # into free blocks
    tier.load(kv, [(s, 40 + i) for i, s in enumerate((1, 3, 5, 7, 9, *range(10, 20)))])
    tier.wait_for_blocks(list(range(40, 80)))
    got = kv.clone()  # read on the compute stream, after the waits
    torch.cuda.synchronize()
    assert all(torch.equal(got[:, :, 60 + s], before[:, :, s]) for s in (0, 2, 4, 6, 8))
    assert all(torch.equal(got[:, :, 40 + i], before[:, :, s])
               for i, s in enumerate((1, 3, 5, 7, 9, *range(10, 20))))
    assert all(torch.equal(tier.read(20 + b), before[:, :, 40 + b].cpu()) for b in range(15))
    tier.fetch_ahead([0, 1])
    tier.offload(kv, [(90, 1)])  # slot 1 written after its fetch: the load reads it anew
    tier.load(kv, [(0, 80), (1, 81)])
    tier.wait_for_blocks([80, 81])
    got = kv[:, :, 80:82].clone()
    torch.cuda.synchronize()
    assert torch.equal(got[:, :, 0], before[:, :, 0]) and torch.equal(got[:, :, 1], before[:, :, 90])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_fetches_of_one_step_add_up_and_each_load_reads_its_own_bytes() -> None:
    """Two prompts' loads in one step, each fetched as the bookkeeping chose it (the second
    overlapping the first, and more than the buffer held: a new buffer while the first's rows
    wait), one slot written by an offload before its load, loads in an order of their own:
    every block gets its slot's bytes, the written slot its new ones."""
    kv = pool(128).to("cuda", torch.bfloat16)
    tier = TierCopies(kv, 64)
    before = kv.clone()
    tier.offload(kv, [(b, b) for b in range(40)])
    tier.fetch_ahead([0, 1, 2, 3])
    tier.fetch_ahead(list(range(2, 30)))  # 2 and 3 fetched already: 26 new rows
    tier.offload(kv, [(100, 5)])  # slot 5 written after its fetch
    tier.load(kv, [(s, 60 + s) for s in (3, 1, 7, 5)])
    tier.load(kv, [(s, 60 + s) for s in (0, 2, *range(8, 30))])
    tier.load(kv, [(s, 60 + s) for s in (4, 6)])
    tier.wait_for_blocks(list(range(60, 90)))
    got = kv[:, :, 60:90].clone()
    torch.cuda.synchronize()
    want = {s: before[:, :, 100 if s == 5 else s] for s in range(30)}
    assert all(torch.equal(got[:, :, s], want[s]) for s in range(30))


def _reads_in_a_graph(kv: torch.Tensor, blocks: int, waits: tuple | None):
    """A CUDA graph that copies each layer of the first `blocks` blocks out, waiting before
    a layer where `waits` says (as the lean decoder does): (graph, where it copies to)."""
    out = torch.empty_like(kv[:, :, :blocks])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in range(kv.shape[0]):
            if waits is not None and waits[layer] is not None:
                torch.cuda.current_stream().wait_event(waits[layer])
            out[layer].copy_(kv[layer, :, :blocks])
    return graph, out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_a_graph_reads_each_layer_part_of_a_load_after_its_wait_node() -> None:
    """A load of 512 blocks (128 MB: ~2.7 ms on the bus) and at once a graph that reads them
    layer by layer: with a wait node before each part (`layer_waits`, set by
    `wait_for_blocks(by_layer=True)`) it reads the loaded bytes; the same graph without them
    reads the pool before the load (so the waits are what orders it). A pass still running
    when the next load is waited for (`after_pass`) makes that load waited for whole."""
    n = 512  # run 54: with 128 (32 MB) the host's launches took longer than the bus
    kv = torch.randn((8, 2, n + 32, 16, 8, 64), device="cuda", dtype=torch.bfloat16)
    tier = TierCopies(kv, n)
    assert tier.parts == 4
    before = kv.clone()
    tier.offload(kv, [(b, b) for b in range(n)])
    kv[:, :, :n] = 0
    torch.cuda.synchronize()
    waited, waited_out = _reads_in_a_graph(kv, n, tier.layer_waits(list(range(8))))
    unwaited, unwaited_out = _reads_in_a_graph(kv, n, None)
    waited.replay(), unwaited.replay()  # a graph's first replay uploads it: milliseconds
    torch.cuda.synchronize()

    def load_then(graph, busy: bool = False) -> None:
        kv[:, :, :n] = 0
        torch.cuda.synchronize()
        if busy:  # a long pass, still running when the load is waited for
            torch.cuda._sleep(20_000_000)
            tier.after_pass()
        tier.load(kv, [(b, b) for b in range(n)])
        tier.wait_for_blocks(range(n), by_layer=True)
        graph.replay()
        tier.after_pass()
        torch.cuda.synchronize()

    load_then(waited)
    assert torch.equal(waited_out, before[:, :, :n])
    load_then(unwaited)  # the waits are in the other graph: this one reads early
    assert not torch.equal(unwaited_out, before[:, :, :n])
    load_then(waited)  # again: the events are set anew for each pass
    assert torch.equal(waited_out, before[:, :, :n])
    load_then(unwaited, busy=True)  # so the compute stream waits for the whole load first
    assert torch.equal(unwaited_out, before[:, :, :n])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("store", ["evicted", "computed"])  # computed: stored after the pass
def test_on_cuda_serving_with_the_tier_gives_the_tokens_of_recomputing(tiny_model, store) -> None:
    prompts = [[300 + (i * 7 + j) % 900 for j in range(70)] for i in range(3)]

    def run(tier: int) -> list:
        eng = LLMEngine(EngineConfig(model="tiny-random", device="cuda", dtype="float32",
                                     block_size=8, num_gpu_blocks=24, num_offload_blocks=tier,
                                     track_kv_content=True, tier_store=store))
        outs = []
        for again in range(2):  # the second round finds each prompt's blocks in the tier
            for p in prompts:
                outs.append(eng.generate(p + [again], SamplingParams(max_tokens=5, ignore_eos=True))[0])
        assert (eng.snapshot().metrics.offload_hit_blocks > 0) == bool(tier)
        return [o.outputs[0].token_ids for o in outs]

    assert run(64) == run(0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("store", ["evicted", "computed"])
def test_on_cuda_a_prefix_loaded_over_several_steps_beside_a_decode(tiny_model, monkeypatch,
                                                                      store) -> None:
    """The tier's loads in parts while another request decodes, on the GPU's streams: the
    repeated prompt's tokens and the decoding request's are those of recomputing (float32)."""
    monkeypatch.setattr(scheduler, "TIER_LOAD_CHUNK", 2)
    prompt = [300 + (j * 7) % 900 for j in range(70)]

    def run(tier: int) -> list:
        eng = LLMEngine(EngineConfig(model="tiny-random", device=DEVICE, dtype="float32",
                                     block_size=8, num_gpu_blocks=12, num_offload_blocks=tier,
                                     track_kv_content=True, async_scheduling=True,
                                     tier_store=store))
        params = SamplingParams(max_tokens=5, ignore_eos=True)
        outs = [eng.generate(prompt + [1], params)[0], eng.generate(prompt[::-1], params)[0]]
        eng.add_request([5, 6, 7, 8], SamplingParams(max_tokens=40, ignore_eos=True))
        eng.step()
        eng.add_request(prompt + [2], params)
        loads = 0
        while eng.has_pending_work():
            res = eng.step()
            outs += res.finished
            loads += any(e.kind == "load" for e in res.events)
        eng.check_invariants()
        assert (loads >= 3) == bool(tier)  # in parts: two blocks a step
        return sorted((o.request_id, o.outputs[0].token_ids) for o in outs)

    assert run(64) == run(0)

