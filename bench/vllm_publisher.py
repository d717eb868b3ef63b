"""Run by vLLM's python (bench/vllm_watch_rate.py starts it): vLLM's own ZmqEventPublisher
publishes KV event batches of vLLM's own BlockStored / BlockRemoved types, as its scheduler
would, as fast as it can or paced to a rate. Prints what it sent as one JSON line."""

import argparse
import json
import os
import sys
import time

# only the repository root: bench/'s own scripts must not shadow installed modules (vLLM's imports)
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

from vllm.distributed.kv_events import (  # noqa: E402
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)


def batch(i: int, per_batch: int, block_size: int) -> KVEventBatch:
    """A step's events: blocks stored (a prompt's next block, chained) and, every other step,
    one evicted, each block its own event (the worst case for a reader: most events a byte)."""
    events = []
    for j in range(per_batch):
        h = i * per_batch + j + 1
        if j % 2 and i:
            events.append(BlockRemoved(block_hashes=[h - per_batch], medium="GPU"))
        else:
            events.append(BlockStored(block_hashes=[h], parent_block_hash=h - 1 if j else None,
                                      token_ids=list(range(h, h + block_size)),
                                      block_size=block_size, lora_id=None, medium="GPU",
                                      lora_name=None, group_idx=0))
    return KVEventBatch(ts=time.time(), events=events)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--replay", required=True)
    ap.add_argument("--batches", type=int, default=20000)
    ap.add_argument("--per-batch", type=int, default=4)
    ap.add_argument("--rate", type=float, default=0.0, help="events/s to pace at (0: flat out)")
    args = ap.parse_args()
    pub = ZmqEventPublisher(data_parallel_rank=0, endpoint=args.endpoint,
                            replay_endpoint=args.replay)
    time.sleep(1.0)  # the watch's subscription reaches the publisher
    start = time.perf_counter()
    for i in range(args.batches):
        if args.rate:
            time.sleep(max(0.0, start + i * args.per_batch / args.rate - time.perf_counter()))
        pub.publish(batch(i, args.per_batch, 32))
    queued = time.perf_counter() - start
    while pub._event_queue.qsize():  # its thread sends what is queued
        time.sleep(0.01)
    sent = time.perf_counter() - start
    time.sleep(3.0)  # answer replay requests for a while before closing
    pub.shutdown()
    print(json.dumps({"batches": args.batches, "events": args.batches * args.per_batch,
                      "queued_s": queued, "sent_s": sent}))


if __name__ == "__main__":
    main()
