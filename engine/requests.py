"""What needs the engine to check: token ids inside this model's vocabulary, prompts that fit its
length, requests that fit its pool. Checked before any state changes (an operation is
all-or-nothing, and a bad one must say what to fix). The shapes of the arguments (a list of
whole numbers, a non-blank prompt) were checked once already, when the operation was made
(engine/ops.py)."""

from __future__ import annotations

from typing import Any

from engine.core.sequence import SamplingParams


def token_list(token_ids: tuple[int, ...], what: str, vocab_size: int) -> list[int]:
    """`token_ids` (whole numbers, see ops.token_ids) as a list inside the vocabulary, or a
    ValueError naming `what`."""
    if not token_ids or (min(token_ids) >= 0 and max(token_ids) < vocab_size):
        return list(token_ids)
    for t in token_ids:
        if not 0 <= t < vocab_size:
            raise ValueError(f"{what}: token id {t} is outside the vocabulary "
                             f"(0..{vocab_size - 1})")
    return list(token_ids)


def prompt_tokens(prompt: str | tuple[int, ...], tokenizer: Any, vocab_size: int,
                  max_model_len: int) -> list[int]:
    """A prompt (non-blank text, or token ids: see ops.prompt) as token ids that fit the engine."""
    if isinstance(prompt, str):
        tokens = tokenizer.encode(prompt)
    else:
        tokens = token_list(prompt, "prompt", vocab_size)
    if not tokens:  # text a tokenizer turns into nothing
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


def chat_prompt(tokenizer: Any, message: str, system: str = "") -> list[int] | None:
    """A user message as a chat model takes it: the token ids of its chat template (after
    `system`, if given), or None where the tokenizer has none (the dry mode's bytes). On the
    bare text of an instruction SmolLM2 answers its end-of-turn token at once."""
    if not getattr(getattr(tokenizer, "hf", None), "chat_template", None):
        return None
    return list(tokenizer.apply_chat_template(message, system))
