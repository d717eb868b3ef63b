"""`finished_requests()`: the final outputs of every finished request, kept by the engine in the
order its steps reported them, and rebuilt the same by a replay of the op log."""

from engine import EngineConfig, LLMEngine, SamplingParams


def config(**kw) -> EngineConfig:
    return EngineConfig(model=None, block_size=4, num_gpu_blocks=32, **kw)


def test_finished_requests_keep_every_steps_finished_outputs_and_replay_the_same():
    eng = LLMEngine(config())
    assert eng.finished_requests() == []
    eng.add_request("Paged memory is", SamplingParams(max_tokens=5, n=2, temperature=1.0))
    eng.add_request("Beams", SamplingParams(max_tokens=4, beam_width=2))
    eng.add_request("short", SamplingParams(max_tokens=1))
    reported = []
    while eng.has_pending_work():
        reported += eng.step().finished
        assert eng.finished_requests() == reported
    assert sorted(o.request_id for o in reported) == [0, 1, 2]
    by_id = {o.request_id: o for o in eng.finished_requests()}
    assert len(by_id[0].outputs) == 2 and len(by_id[1].outputs) == 2
    assert all(o.finished for o in by_id.values())
    replayed = LLMEngine.replay(eng.config, eng.trace)
    assert replayed.finished_requests() == eng.finished_requests()
    assert [[c.text for c in o.outputs] for o in replayed.finished_requests()] == \
        [[c.text for c in o.outputs] for o in eng.finished_requests()]


def test_the_list_is_a_copy_and_an_aborted_request_is_kept_too():
    eng = LLMEngine(config())
    eng.add_request("abcdef", SamplingParams(max_tokens=8))
    eng.step()
    eng.finished_requests().append("junk")
    assert eng.finished_requests() == []
    (seq,) = eng.request(0).live_seq_ids
    eng.free(seq)  # freeing every sequence of a running request aborts it
    eng.step()
    (out,) = eng.finished_requests()
    assert out.request_id == 0 and out.finished
