"""Bad input to the dry engine: a clear error naming the problem, and the state unchanged."""

import pytest

from engine import EngineConfig, LLMEngine, OutOfBlocks, SamplingParams
from tests.helpers import fingerprint


@pytest.fixture
def eng() -> LLMEngine:
    e = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=4))
    s = e.add_sequence([1, 2, 3, 4, 5])
    e.fork(s)
    return e


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda e: e.append(99, n=1), "unknown sequence id 99"),
        (lambda e: e.fork(-1), "unknown sequence id -1"),
        (lambda e: e.free("0"), "a sequence id is a whole number"),
        (lambda e: e.append(True, n=1), "a sequence id is a whole number"),
        (lambda e: e.add_sequence(""), "the prompt is empty"),
        (lambda e: e.add_sequence("   \n"), "the prompt is empty"),
        (lambda e: e.add_sequence([]), "the prompt is empty"),
        (lambda e: e.add_sequence([1, 2.0]), "a token id must be an int, got 2.0"),
        (lambda e: e.add_sequence([1, "2"]), "a token id must be an int"),
        (lambda e: e.add_sequence([1, -3]), "outside the vocabulary"),
        (lambda e: e.add_sequence(None), "must be a list of token ids"),
        (lambda e: e.add_sequence(list(range(17))), "more than the 16 this engine can hold"),
        (lambda e: e.append(0, n=0), "n must be a whole number from 1"),
        (lambda e: e.append(0, n=-2), "n must be a whole number from 1"),
        (lambda e: e.append(0, n=2.5), "n must be a whole number from 1"),
        (lambda e: e.append(0, token_ids=[]), "token_ids is empty"),
        (lambda e: e.append(0, token_ids="abc"), "must be a list of token ids"),
        (lambda e: e.append(0, n=2, token_ids=[1]), "either n or token_ids"),
    ],
)
def test_bad_argument_is_refused_with_a_clear_message_and_nothing_changes(eng, call, message):
    before = fingerprint(eng)
    with pytest.raises(ValueError, match=message):
        call(eng)
    assert fingerprint(eng) == before
    eng.check_invariants()
    eng.append(0, n=1)  # the session still works


def test_double_free_names_the_step_it_was_freed_at(eng):
    eng.free(1)
    before = fingerprint(eng)
    with pytest.raises(ValueError, match="seq 1 was freed at step 3"):
        eng.free(1)
    with pytest.raises(ValueError, match="seq 1 was freed"):
        eng.append(1, n=1)
    assert fingerprint(eng) == before


def test_pool_too_small_refuses_the_whole_operation(eng):
    before = fingerprint(eng)
    with pytest.raises(OutOfBlocks, match=r"needs 3 free block\(s\) but the pool has only 2"):
        eng.append(0, n=10)  # a CoW block plus two more; only two are free
    assert fingerprint(eng) == before
    with pytest.raises(OutOfBlocks, match="Free a sequence, or use a larger pool"):
        eng.add_sequence([9] * 12)
    assert fingerprint(eng) == before
    eng.check_invariants()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"block_size": 0}, "block_size must be between 1 and 128"),
        ({"block_size": -4}, "block_size must be between 1 and 128"),
        ({"block_size": 4.0}, "block_size must be a whole number"),
        ({"num_gpu_blocks": 0}, "num_gpu_blocks must be between 1"),
        ({"num_gpu_blocks": None}, "the dry mode needs num_gpu_blocks"),
        ({"num_cpu_blocks": -1}, "num_cpu_blocks must be between 0"),
        ({"preemption_mode": "drop"}, "preemption_mode must be 'recompute' or 'swap'"),
        ({"seed": -1}, "seed must be a non-negative"),
        ({"device": "tpu"}, "device must be"),
        ({"enable_chunked_prefill": "yes"}, "enable_chunked_prefill must be True or False"),
    ],
)
def test_bad_config_is_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model=None, **kw)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be between 1"),
        ({"temperature": -1}, "temperature must be between"),
        ({"temperature": float("nan")}, "temperature must be between"),
        ({"top_p": 0}, "top_p must be > 0"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"n": 0}, "n must be between 1"),
        ({"n": 2, "beam_width": 2}, "either n > 1"),
        ({"stop": [""]}, "stop must be a list of non-empty strings"),
    ],
)
def test_bad_sampling_params_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kw)


@pytest.mark.parametrize("op", ["append", "fork", "free"])
def test_primitives_refuse_a_request_sequence_that_is_not_in_the_pool(op):
    """A request's sequence that is waiting (no blocks yet) or swapped out (blocks on the CPU)
    is the scheduler's; append / fork / free on it would give blocks no table holds (found by
    the fuzz test: add a request, then append to its sequence). Refused, nothing changes."""
    eng = LLMEngine(EngineConfig(model=None, block_size=1, num_gpu_blocks=3,
                                 enable_prefix_caching=False))
    eng.add_request("ab", SamplingParams(max_tokens=1, beam_width=2))
    before = fingerprint(eng)
    with pytest.raises(ValueError, match="waiting for its first step"):
        getattr(eng, op)(0)
    assert fingerprint(eng) == before
    eng.check_invariants()

    swapping = LLMEngine(EngineConfig(model=None, block_size=2, num_gpu_blocks=6, num_cpu_blocks=6,
                                      preemption_mode="swap"))
    for prompt in ("abcd", "efgh"):
        swapping.add_request(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    for _ in range(20):
        swapping.step()
        swapped = [s for s in swapping.seqs.values() if s.status.value == "swapped"]
        if swapped:
            break
    assert swapped, "the pool never ran short: make it smaller"
    before = fingerprint(swapping)
    with pytest.raises(ValueError, match="swapped out to the CPU"):
        getattr(swapping, op)(swapped[0].seq_id)
    assert fingerprint(swapping) == before
    swapping.check_invariants()
