"""Next-token choice from real logits: greedy, temperature, top-k, top-p; beam candidates.

Wraps one step's logits (one row per sequence that ran). Work that serves every row, the log
softmax and the greedy argmax, is done once for the whole batch on the device, and read back in
one transfer, so a decode step does not sync once per sequence.
"""

from __future__ import annotations

import torch

from engine.sequence import SamplingParams


class TorchScores:
    def __init__(self, logits: torch.Tensor, logprobs: torch.Tensor | None = None,
                 greedy: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """`logprobs` and `greedy` (token ids, their log probs): already computed on the device
        by the decode graph, when it ran."""
        self.logits = logits.float()  # [rows, vocab]
        self.num_rows = logits.shape[0]
        self._logprobs = logprobs
        self._greedy_tensors = greedy
        self._greedy: list[tuple[int, float]] | None = None

    def logprobs(self) -> torch.Tensor:
        if self._logprobs is None:
            self._logprobs = torch.log_softmax(self.logits, dim=-1)
        return self._logprobs

    def greedy(self, row: int) -> tuple[int, float]:
        if self._greedy is None:
            if self._greedy_tensors is None:
                lp = self.logprobs()
                best = lp.argmax(dim=-1)
                self._greedy_tensors = best, lp.gather(1, best[:, None])[:, 0]
            best, best_lp = self._greedy_tensors
            self._greedy = list(zip(best.tolist(), best_lp.tolist(), strict=True))
        return self._greedy[row]

    def sample(self, row: int, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
        """(token, its log probability under the model). Temperature 0 is greedy."""
        if params.temperature == 0:
            return self.greedy(row)
        logits = self.logits[row] / params.temperature
        if params.top_k and params.top_k < logits.shape[-1]:
            kth = torch.topk(logits, params.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            # drop a token when the mass before it already reaches top_p (the first always stays)
            drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
            logits = logits.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
        probs = torch.softmax(logits, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator).item())
        return token, float(self.logprobs()[row, token].item())

    def top(self, row: int, k: int) -> list[tuple[int, float]]:
        """The k most likely next tokens with their log probabilities, best first."""
        values, ids = torch.topk(self.logprobs()[row], k)
        return list(zip(ids.tolist(), values.tolist(), strict=True))

    def make_generator(self, seed: int) -> torch.Generator:
        gen = torch.Generator(device=self.logits.device)
        gen.manual_seed(seed)
        return gen
