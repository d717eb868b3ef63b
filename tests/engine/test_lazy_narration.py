"""Events keep ids and numbers; their narration is written when a view reads it. A serving step
on a real model must not decode a single token's text for narration that nobody asked for."""

from __future__ import annotations

import pickle

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.describe.narration import logged, narrate


@pytest.fixture
def counted_decode(tiny_model, monkeypatch):
    """Every call of the tiny model's tokenizer's decode, counted (patched on its class before
    the engine exists, so the narration's handle on decode goes through the count too)."""
    tok_type = type(tiny_model.tokenizer)
    real = tok_type.decode
    calls = []

    def decode(self, *args, **kwargs):
        calls.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(tok_type, "decode", decode)
    return calls, tiny_model.tokenizer


def test_a_serving_step_decodes_nothing_until_its_narration_is_read(counted_decode):
    calls, tok = counted_decode
    eng = LLMEngine(EngineConfig(model="tiny-random", device="cpu", dtype="float32",
                                 block_size=4, num_gpu_blocks=1024))
    for i in range(64):
        eng.add_request([1 + i, 2, 3, 4, 5], SamplingParams(max_tokens=6, ignore_eos=True))
    events = []
    for _ in range(4):
        events += eng.step().events
    appends = [e for e in events if e.kind == "append"]
    assert len(appends) >= 64 * 3 and calls == []  # 64 sequences appended tokens, none decoded

    # the eager sentence, as the engine used to write it when the token was appended
    eager = [f"seq {e.seq_id} wrote {tok.decode([e.token_ids[0]])!r} into slot {e.slot} "
             f"of block {e.block_ids[0]}" for e in appends]
    calls.clear()
    assert [narrate(e) for e in appends] == eager
    assert calls  # read now: the narration decoded the tokens it names
    assert all(logged(e) == f"[step {e.step}] {narrate(e)}" for e in events)


def test_events_pickle_and_compare_across_engines():
    def run() -> list:
        eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=16))
        s = eng.add_sequence("abcdef")
        eng.fork(s)
        return eng.append(s, token_ids=[104, 105])

    first, second = run(), run()
    assert first == second  # how a token is shown is no part of what happened
    again = pickle.loads(pickle.dumps(first))
    assert again == first and [narrate(e) for e in again] == [narrate(e) for e in first]
    assert "copy-on-write: block 1 copied to block 2" in " ".join(narrate(e) for e in first)
