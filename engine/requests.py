"""What the engine accepts from a caller: prompts, token lists and requests, checked before any
state changes (an operation is all-or-nothing, and a bad one must say what to fix)."""

from __future__ import annotations

from typing import Any

from engine.core.sequence import SamplingParams


def token_list(token_ids: object, what: str, vocab_size: int) -> list[int]:
    """`token_ids` as a list of ids inside the vocabulary, or a ValueError naming `what`."""
    if isinstance(token_ids, str | bytes) or not isinstance(token_ids, list | tuple):
        raise ValueError(f"{what} must be a list of token ids, got {type(token_ids).__name__}")
    for t in token_ids:
        if isinstance(t, bool) or not isinstance(t, int):
            raise ValueError(f"{what}: a token id must be an int, got {t!r}")
        if not 0 <= t < vocab_size:
            raise ValueError(f"{what}: token id {t} is outside the vocabulary "
                             f"(0..{vocab_size - 1})")
    return list(token_ids)


def prompt_tokens(prompt: object, tokenizer: Any, vocab_size: int, max_model_len: int
                  ) -> list[int]:
    """A prompt (text, or token ids) as token ids that fit the engine."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty: type some text to start a sequence")
        tokens = tokenizer.encode(prompt)
    else:
        tokens = token_list(prompt, "prompt", vocab_size)
    if not tokens:
        raise ValueError("the prompt is empty: give at least one token")
    if len(tokens) > max_model_len:
        raise ValueError(f"the prompt has {len(tokens)} tokens, more than the {max_model_len} "
                         f"this engine can hold; shorten it")
    return tokens


def check_request_fits(tokens: list[int], params: SamplingParams, max_model_len: int,
                       block_size: int, num_blocks: int) -> None:
    """A request whose prompt and outputs could never fit is refused when it is added."""
    if len(tokens) + params.max_tokens > max_model_len:
        raise ValueError(f"prompt ({len(tokens)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                         f"the {max_model_len} tokens this engine can hold; lower max_tokens")
    if -(-len(tokens) // block_size) > num_blocks:
        raise ValueError(f"the prompt needs {-(-len(tokens) // block_size)} blocks but the pool "
                         f"has {num_blocks}")
