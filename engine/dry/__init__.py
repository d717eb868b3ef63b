"""The dry mode: no model and no tensors, only the bookkeeping. A byte tokenizer and seeded
random next-token scores stand in for the runtime (huge pools, fast tests, comparisons)."""
