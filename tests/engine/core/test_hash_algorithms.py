"""vLLM's block hash chain in PagedLab (EngineConfig.prefix_caching_hash_algo, hash_seed).

The known answers below are what vLLM 0.32.0's own `hash_block_tokens` +
`maybe_convert_block_hash` gave for these blocks (vllm/v1/core/kv_cache_utils.py, run in
.venv-vllm); tests/vllm/test_hashes.py recomputes them live from vLLM when it is installed.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from engine import EngineConfig, LLMEngine
from engine.core.hashing import ALGORITHMS, VllmBlockHash, hash_block, hash_function

BLOCKS = [[1, 2, 3, 4], [5, 6, 70000, 8], [2**31, 9, 0, 1]]
VLLM_SEED_7 = {  # PYTHONHASHSEED=7
    "sha256": [4738391569097814517, 10872434942249723818, 14400612844441174115],
    "sha256_cbor": [12193498987697778473, 7346069642961442903, 9451960896406740290],
    "xxhash": [7727105983730003878, 11445001368673818533, 7009170959524712465],
    "xxhash_cbor": [9236299268554705308, 14198261685012526584, 14857429349983186444],
}
VLLM_DEFAULT = {  # PYTHONHASHSEED unset: the sha256 ones seed NONE_HASH with "vllm-none-hash"
    "sha256": [1882140585328457242, 5963188238064855060, 18298143708748115040],
    "sha256_cbor": [9561501211280363793, 15952242049961967061, 18315938026912381828],
}


def chain(algo: str, seed: str | None, blocks=BLOCKS) -> list[int]:
    fn, parent, out = hash_function(algo, seed), None, []
    for b in blocks:
        parent = fn(parent, b)
        out.append(parent)
    return out


@given(st.none() | st.integers(0, 2**64 - 1),
       st.lists(st.integers(-1, 2**40), max_size=40))
def test_pagedlabs_hash_is_xxh64_of_the_parent_then_the_tokens(parent, tokens):
    """The chain as its docstring defines it, streamed into xxh64 piece by piece: the packed
    form hashes the same bytes (a prefix cached before the change is found after it)."""
    h = xxhash.xxh64()
    if parent is not None:
        h.update(parent.to_bytes(8, "little"))
    for t in tokens:
        h.update(t.to_bytes(8, "little", signed=True))
    assert hash_block(parent, tokens) == h.intdigest()
    assert hash_block(parent, tuple(tokens)) == h.intdigest()


@pytest.mark.parametrize("algo", sorted(VLLM_SEED_7))
def test_each_algorithm_gives_vllms_hashes(algo):
    assert chain(algo, "7") == VLLM_SEED_7[algo]
    if algo in VLLM_DEFAULT:
        assert chain(algo, None) == VLLM_DEFAULT[algo]


def test_the_seed_changes_every_hash_and_pagedlab_stays_the_default():
    assert EngineConfig().prefix_caching_hash_algo == "pagedlab"
    assert hash_function() is hash_block
    assert all(a != b for a, b in zip(chain("sha256", "0"), chain("sha256", "1"), strict=True))


def test_a_vllm_hash_is_the_published_int_and_keeps_its_digest():
    h = chain("sha256", None)[0]
    assert isinstance(h, VllmBlockHash) and type(h) is not int
    assert h == int.from_bytes(h.digest, "big") & ((1 << 64) - 1) and len(h.digest) == 32
    for again in (pickle.loads(pickle.dumps(h)), copy.deepcopy(h)):
        assert again == h and again.digest == h.digest
    with pytest.raises(TypeError, match="not a sha256 block hash"):  # a plain int lost the chain
        hash_function("sha256")(int(h), [1, 2, 3, 4])


@pytest.mark.parametrize("kwargs, words", [
    ({"prefix_caching_hash_algo": "md5"}, "must be one of pagedlab, sha256"),
    ({"prefix_caching_hash_algo": None}, "must be a name"),
    ({"prefix_caching_hash_algo": "sha256", "hash_seed": 7}, "hash_seed must be None or a string"),
    ({"hash_seed": "0"}, "'pagedlab' hash chain has no seed"),
    ({"prefix_caching_hash_algo": "xxhash"}, "random NONE_HASH seed per process"),
])
def test_bad_values_are_refused_with_what_to_do(kwargs, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig(model=None, **kwargs)


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_a_dry_engine_shares_prefixes_and_its_hashes_chain_like_vllms(algo):
    seed = None if algo in ("pagedlab", "sha256", "sha256_cbor") else "3"
    cfg = EngineConfig(model=None, block_size=4, num_gpu_blocks=16,
                       prefix_caching_hash_algo=algo, hash_seed=seed)
    eng = LLMEngine(cfg)
    a = eng.add_sequence(list(range(10, 22)))  # 12 tokens: 3 full blocks
    b = eng.add_sequence(list(range(10, 18)) + [99, 98, 97])  # its first 2 blocks are a's
    snap = eng.snapshot()
    assert snap.metrics.prefix_hit_blocks == 2
    assert snap.sequences[b].block_table[:2] == snap.sequences[a].block_table[:2]
    hashes = [snap.blocks[i].block_hash for i in snap.sequences[a].block_table]
    assert hashes == chain(algo, seed, [list(range(10, 14)), list(range(14, 18)),
                                        list(range(18, 22))])
    tree = eng.prefix_tree()
    assert {(n.parent, n.block_hash) for n in tree.nodes} == {
        (None, hashes[0]), (hashes[0], hashes[1]), (hashes[1], hashes[2])}
    eng.check_invariants()
    # the op log carries the algorithm: a replay from the exported config gives the same hashes
    again = LLMEngine.replay(EngineConfig.from_dict(cfg.to_dict()), eng.trace)
    assert [b.block_hash for b in again.snapshot().blocks] == [b.block_hash for b in snap.blocks]
    assert cfg.to_dict()["prefix_caching_hash_algo"] == algo and cfg.to_dict()["hash_seed"] == seed


def test_a_checkpoint_keeps_the_digests_the_chain_goes_on_from():
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=16,
                                 prefix_caching_hash_algo="sha256_cbor"))
    a = eng.add_sequence(list(range(10, 16)))
    point = eng.checkpoint()
    eng.append(a, token_ids=[1, 2])  # fills block 1: hashed from block 0's digest
    after = [b.block_hash for b in eng.snapshot().blocks]
    eng.restore(point)
    eng.append(a, token_ids=[1, 2])
    assert [b.block_hash for b in eng.snapshot().blocks] == after
