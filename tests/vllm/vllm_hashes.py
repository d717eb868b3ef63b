"""Run by vLLM's python (tests/vllm/test_hashes.py): vLLM's own block hashes of the blocks given
on stdin ({"blocks": [...], "seeds": [null or a PYTHONHASHSEED value, ...]}), for each seed and
each of its algorithms, printed as JSON {seed: {algo: [hash, ...]}}. vLLM reads PYTHONHASHSEED
when it seeds NONE_HASH (`init_none_hash`), so one process serves every seed."""

import json
import os
import sys

from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils

if __name__ == "__main__":
    given = json.load(sys.stdin)
    out = {}
    for seed in given["seeds"]:
        if seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = seed
        out[str(seed)] = {}
        for algo in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"):
            fn = get_hash_fn_by_name(algo)
            kv_cache_utils.init_none_hash(fn)
            parent, hashes = None, []
            for block in given["blocks"]:
                parent = kv_cache_utils.hash_block_tokens(fn, parent, block)
                hashes.append(kv_cache_utils.maybe_convert_block_hash(parent))
            out[str(seed)][algo] = hashes
    print(json.dumps(out))
