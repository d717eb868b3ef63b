"""What the engine hands out pickles (a ZeroGPU call returns it from a forked worker): snapshots
with their read-only mappings, and finished outputs with their text instead of the tokenizer."""

from __future__ import annotations

import pickle

from engine import EngineConfig, LLMEngine, SamplingParams


def test_snapshots_and_outputs_pickle_and_come_back_equal() -> None:
    eng = LLMEngine(EngineConfig(model=None, num_gpu_blocks=16, block_size=4))
    outs = eng.generate(["hello there", "abc"], SamplingParams(max_tokens=5, n=2, temperature=1.0))
    seq = eng.add_sequence("a fork of this")
    eng.fork(seq)
    snap = eng.snapshot()
    again = pickle.loads(pickle.dumps(snap))
    assert again == snap and again.sequences[seq].text == snap.sequences[seq].text
    try:
        again.sequences[99] = None  # still read-only
        raise AssertionError("a snapshot's sequences became writable")
    except TypeError:
        pass
    back = pickle.loads(pickle.dumps(outs))
    assert [[c.text for c in o.outputs] for o in back] == [[c.text for c in o.outputs] for o in outs]
    assert back[0].outputs[0].token_ids == outs[0].outputs[0].token_ids
