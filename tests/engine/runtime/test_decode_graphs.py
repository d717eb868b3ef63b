"""The static decode path (what the CUDA graphs capture) computes what the general path computes.

On the CPU the decode function runs eagerly from the same static buffers, padded to the graph
buckets when asked, so buffer layout, padding rows and the forward pass are all checked here;
the CUDA test replays real graphs against the eager path.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.runtime.cache_engine import CacheEngine
from engine.runtime.decode_graphs import DecodeGraphs, DecodeStep
from engine.runtime.model_runner import ModelRunner
from engine.runtime.protocols import StepItem

BS = 4


def prefilled_batch(runner: ModelRunner, tokenizer, prompts: list[str]) -> list[StepItem]:
    """Prefill each prompt into scattered blocks; return the decode step that follows."""
    free = list(range(runner.cache.num_gpu_blocks))[::-1][1::2] + list(range(0, 64, 2))
    batch = []
    for prompt in prompts:
        ids = tokenizer(prompt)["input_ids"]
        table = [free.pop() for _ in range(-(-(len(ids) + 1) // BS))]
        runner.execute([StepItem(ids, 0, table)])
        batch.append(StepItem([len(ids) * 7 % 500 + 3], len(ids), table))
    return batch


PROMPTS = ["The capital of France is", "def f(x):", "Paged attention keeps blocks"]


@pytest.mark.parametrize("pad", [False, True])
def test_static_decode_equals_the_general_path(tiny_model, pad):
    general = ModelRunner(tiny_model, CacheEngine(tiny_model, 64, BS))
    static = ModelRunner(tiny_model, CacheEngine(tiny_model, 64, BS), max_batch=8)
    static.graphs.pad = pad  # 3 sequences in the bucket of 4: one padding row
    want = general.execute(prefilled_batch(general, tiny_model.tokenizer, PROMPTS))
    batch = prefilled_batch(static, tiny_model.tokenizer, PROMPTS)
    cache_before = static.cache.kv_cache.clone()
    scores = static.execute_scores(batch)
    torch.testing.assert_close(scores.logits, want, atol=1e-5, rtol=1e-5)
    assert [scores.greedy(i)[0] for i in range(3)] == want.argmax(-1).tolist()
    lp = torch.log_softmax(want, -1)
    assert scores.greedy(1)[1] == pytest.approx(float(lp[1].max()), abs=1e-5)
    # exactly the three new tokens' slots changed: the padding row wrote nothing
    changed = (static.cache.kv_cache != cache_before).flatten(4).any(-1)  # [layer, kv, block, slot]
    slots = {(s.block_table[s.num_computed // BS], s.num_computed % BS) for s in batch}
    assert {tuple(x) for x in changed.nonzero()[:, 2:].tolist()} == slots
    assert static.num_tokens_computed == general.num_tokens_computed


def test_decode_falls_back_to_the_general_path_past_its_buffers(tiny_model):
    runner = ModelRunner(tiny_model, CacheEngine(tiny_model, 64, BS), max_batch=2)
    batch = prefilled_batch(runner, tiny_model.tokenizer, PROMPTS)
    assert not runner.graphs.fits(3, 2)
    scores = runner.execute_scores(batch)  # 3 > max_batch: the general path, same answer
    assert scores.num_rows == 3


def test_bucket_sizes_cover_every_batch():
    graphs = DecodeGraphs(lambda *a: None, torch.device("cpu"), 100, 8, 32, pad=True)
    assert graphs.sizes[-1] == 100
    assert all(graphs.bucket(n) >= n for n in range(1, 101))
    assert graphs.bucket(1) == 1 and graphs.bucket(17) == 24 and graphs.bucket(97) == 100


@pytest.mark.parametrize("use_lean", [True, False])
def test_the_captured_forward_never_reads_the_device(tiny_model, monkeypatch, use_lean):
    """A CUDA graph capture fails on any host read: the code around our kernels must make none,
    in the lean decoder and in the module path (transformers' mask building would read the
    device, so the runner hands it a ready-made mask)."""
    runner = ModelRunner(tiny_model, CacheEngine(tiny_model, 64, BS), max_batch=4,
                         use_lean=use_lean, max_query=3)
    assert (runner.lean is not None) == use_lean
    batch = prefilled_batch(runner, tiny_model.tokenizer, PROMPTS)
    reads = []
    allowed = {"on": False}

    def guard(name):
        original = getattr(torch.Tensor, name)

        def reading(self, *a, **k):
            if not allowed["on"]:
                reads.append(name)
            return original(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, reading)

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy"):
        guard(name)

    def unguarded(fn):  # kernels are launches on a GPU; on the CPU they are torch references
        def call(*a, **k):
            allowed["on"] = True
            try:
                return fn(*a, **k)
            finally:
                allowed["on"] = False
        return call

    ops = runner.cache.ops
    monkeypatch.setattr(runner.cache, "ops", dataclasses.replace(ops, **{
        f.name: unguarded(getattr(ops, f.name)) for f in dataclasses.fields(ops)
        if f.name != "name"}))
    graphs = runner.graphs
    for q in (1, 3):  # a decode, and a verification of drafts of up to 2 tokens (one padded)
        step = DecodeStep([t for i, s in enumerate(batch) for t in (s.token_ids[0], 5, 6)[:q]],
                          [s.num_computed for s in batch], [min(i, q - 1) for i in range(3)],
                          [10 + i for i in range(3)], [[s.block_table for s in batch]], q)
        allowed["on"] = True
        graphs.prepare(step)  # the host's part: it may read what it likes
        allowed["on"] = False
        with torch.inference_mode():
            graphs._compute(3, q)
    assert reads == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_replay_equals_eager_on_cuda():
    from engine.runtime.models import load_model

    lm = load_model("tiny-random", device="cuda", dtype="float32")
    eager = ModelRunner(lm, CacheEngine(lm, 64, BS, device=lm.device, dtype=lm.dtype),
                        use_graphs=False)
    graphed = ModelRunner(lm, CacheEngine(lm, 64, BS, device=lm.device, dtype=lm.dtype))
    want = eager.execute_scores(prefilled_batch(eager, lm.tokenizer, PROMPTS))
    batch = prefilled_batch(graphed, lm.tokenizer, PROMPTS)
    got = graphed.execute_scores(batch)
    assert graphed.graphs.num_replays == 1 and (4, 1) in graphed.graphs.graphs
    torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)
    assert [got.greedy(i)[0] for i in range(3)] == [want.greedy(i)[0] for i in range(3)]
    torch.testing.assert_close(graphed.cache.kv_cache, eager.cache.kv_cache, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_lean_graphs_agree_with_the_module_path_on_cuda():
    from engine.runtime.models import load_model

    lm = load_model("tiny-random", device="cuda", dtype="bfloat16")
    modules = ModelRunner(lm, CacheEngine(lm, 64, BS, device=lm.device, dtype=lm.dtype),
                          use_graphs=False, use_lean=False)
    lean = ModelRunner(lm, CacheEngine(lm, 64, BS, device=lm.device, dtype=lm.dtype))
    want = modules.execute_scores(prefilled_batch(modules, lm.tokenizer, PROMPTS))
    got = lean.execute_scores(prefilled_batch(lean, lm.tokenizer, PROMPTS))
    assert lean.lean is not None and lean.graphs.num_replays == 1
    # bf16 rounds differently along the two paths (seen: 0.12 at most, on logits of a few
    # units); a wrong slot, table or rotation would be off by whole units
    assert float((got.logits - want.logits).abs().max()) < 0.25


@pytest.mark.parametrize("pick_rows", [5, 40])  # within the fed buffer (8 rows), and past it
def test_fed_tokens_from_the_last_picks_equal_tokens_sent(tiny_model, pick_rows):
    """Async scheduling: a row's token still on the device, in the last step's picks, is read
    there (gathered inside the static step, or written in before it where the picks outgrow
    the buffer the graph reads them from): the same logits as the token sent from the host."""
    sent = ModelRunner(tiny_model, CacheEngine(tiny_model, 64, BS), max_batch=8)
    fed = ModelRunner(tiny_model, CacheEngine(tiny_model, 64, BS), max_batch=8)
    want = sent.execute_scores(prefilled_batch(sent, tiny_model.tokenizer, PROMPTS)).logits
    batch = prefilled_batch(fed, tiny_model.tokenizer, PROMPTS)
    picks = torch.zeros(pick_rows, dtype=torch.long)
    rows = {0: pick_rows - 1, 2: 1}  # rows 0 and 2 fed from these pick rows; row 1 sent
    for i, r in rows.items():
        picks[r] = batch[i].token_ids[0]
        batch[i] = batch[i]._replace(token_ids=[-1])  # a placeholder, not the token
    assert fed.graphs.can_feed(pick_rows) == (pick_rows <= 8)
    got = fed.execute_scores(batch, feed=(list(rows.items()), picks)).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
