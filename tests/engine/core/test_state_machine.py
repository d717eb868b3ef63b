"""Random add / append / fork / free against every invariant, on pools small enough to run out,
with one block table per sequence or a hybrid's two (full and sliding window), with or without
the CPU tier of the prefix cache.

After every step the invariants hold; a refused operation changes nothing; replaying the op log
rebuilds a bit-identical state.
"""

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine import EngineConfig, LLMEngine, OutOfBlocks
from tests.helpers import fingerprint


class EngineMachine(RuleBasedStateMachine):
    @initialize(
        block_size=st.integers(1, 32),
        num_blocks=st.integers(1, 24),
        prefix=st.booleans(),
        seed=st.integers(0, 3),
        tier=st.sampled_from([0, 0, 1, 3, 8]),
        store=st.sampled_from(["evicted", "computed"]),
        window=st.sampled_from([None, None, 1, 2, 5, 8, 17]),
    )
    def setup(self, block_size, num_blocks, prefix, seed, tier, store, window):
        # a window gives a hybrid's two block tables (full and sliding); the CPU tier serves one
        self.cfg = EngineConfig(model=None, block_size=block_size, num_gpu_blocks=num_blocks,
                                enable_prefix_caching=prefix, seed=seed,
                                num_offload_blocks=tier if window is None else 0,
                                tier_store=store,
                                sliding_window=window)
        self.eng = LLMEngine(self.cfg)

    def attempt(self, fn, *args, **kw):
        """Run an operation; if the engine refuses it (pool full, prompt longer than the pool),
        the state must be exactly as before."""
        before = fingerprint(self.eng)
        trace_len = len(self.eng.trace)
        try:
            return fn(*args, **kw)
        except (OutOfBlocks, ValueError):
            assert fingerprint(self.eng) == before
            assert len(self.eng.trace) == trace_len
            return None

    @rule(data=st.data())
    def add(self, data):
        bs = self.cfg.block_size
        # a tiny vocabulary makes shared prefixes (and so prefix hits) likely
        prompt = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=3 * bs))
        self.attempt(self.eng.add_sequence, prompt)

    @precondition(lambda self: self.eng.seqs)
    @rule(data=st.data(), n=st.integers(1, 40))
    def append_random(self, data, n):
        seq = data.draw(st.sampled_from(sorted(self.eng.seqs)))
        self.attempt(self.eng.append, seq, n=n)

    @precondition(lambda self: self.eng.seqs)
    @rule(data=st.data())
    def append_tokens(self, data):
        seq = data.draw(st.sampled_from(sorted(self.eng.seqs)))
        tokens = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=10))
        self.attempt(self.eng.append, seq, token_ids=tokens)

    @precondition(lambda self: self.eng.seqs)
    @rule(data=st.data())
    def fork(self, data):
        seq = data.draw(st.sampled_from(sorted(self.eng.seqs)))
        before = self.eng.snapshot().metrics.used_blocks
        self.eng.fork(seq)  # a fork never needs a block
        assert self.eng.snapshot().metrics.used_blocks == before

    @precondition(lambda self: self.eng.seqs)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.eng.seqs)))
        self.eng.free(seq)

    @invariant()
    def invariants_hold(self):
        if hasattr(self, "eng"):
            self.eng.check_invariants()

    def teardown(self):
        if not hasattr(self, "eng"):
            return
        replayed = LLMEngine.replay(self.cfg, self.eng.trace)
        assert fingerprint(replayed) == fingerprint(self.eng)
        for seq in list(self.eng.seqs):
            self.eng.free(seq)
        self.eng.check_invariants()
        assert self.eng.snapshot().metrics.used_blocks == 0  # after everything is freed


EngineMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                           deadline=None)
TestEngineMachine = EngineMachine.TestCase
