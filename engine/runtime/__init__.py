"""The tensors, in one process: the loaded model, the paged KV tensors, the model runner (one
forward pass over a mixed batch), decode graphs, the lean decoder and the sampler.

The engine's bookkeeping (`engine.core`) decides which slots and blocks; this package fills them.
What the engine may ask of a runtime and of the scores it returns is written down, torch-free,
in `protocols.py` (the tensor-parallel runtime in `engine.tp` and the dry mode keep it too).
"""
