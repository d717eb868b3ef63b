"""Run by vLLM's python (tests/vllm/test_hashes.py): vLLM's own block hashes of the blocks given
as JSON on stdin, for each of its algorithms, printed as JSON. PYTHONHASHSEED is the seed."""

import json
import sys

from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils

if __name__ == "__main__":
    blocks = json.load(sys.stdin)
    out = {}
    for algo in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"):
        fn = get_hash_fn_by_name(algo)
        kv_cache_utils.init_none_hash(fn)
        parent, hashes = None, []
        for block in blocks:
            parent = kv_cache_utils.hash_block_tokens(fn, parent, block)
            hashes.append(kv_cache_utils.maybe_convert_block_hash(parent))
        out[algo] = hashes
    print(json.dumps(out))
