"""The tensors, in one process: the loaded model, the paged KV tensors, the model runner (one
forward pass over a mixed batch), decode graphs, the lean decoder and the sampler.

The engine's bookkeeping (`engine.core`) decides which slots and blocks; this package fills them.
"""
