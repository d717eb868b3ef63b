"""Serving workloads that show a mechanism at once (Serving's "Load workload"): each is a new
session on the current model and block size, an engine setting or two, and its requests added
(not yet stepped: Step or Run to the end shows them go).

- preemption: four requests in a pool that holds under two of them at full length, swap space
  for about one: some are preempted by swap, some by recompute when swap space is full (the
  requests are instructions: each goes in the model's chat template);
- a shared prefix: four students' questions after one system prompt (the model's chat template,
  as a served chat model sees them): prefix hits, one trunk in the prefix tree;
- beams and samples: a beam search of width 3 beside 4 parallel samples: forks, copy-on-write,
  beams dropped;
- drafts: prompt-lookup speculative decoding (4 draft tokens) on a prompt that repeats itself.

Pools are sized from the prompts' token counts in this engine's tokenizer, so each workload
does what it says at any block size and on the dry mode as on the real model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from engine import EngineConfig, SamplingParams, ops
from engine.requests import chat_prompt
from ui import limits
from ui.session import Session, UserError

SYSTEM = "You are a patient tutor for a class on operating systems. Answer in one sentence. "
LIST = ("Repeat the list exactly, then add one more colour. List: red, green, blue, yellow, "
        "purple, orange, pink, brown. Repeated list:")


class Workload(NamedTuple):
    requests: tuple[tuple[str, SamplingParams], ...]
    settings: Callable[[EngineConfig, int], dict[str, Any]]  # (config, blocks a request needs)
    system: str = ""  # a system prompt every request starts with (the model's chat template)
    chat: bool = False  # instructions: each in the model's chat template (so with a system)


def _preempting(config: EngineConfig, need: int) -> dict[str, Any]:
    pool = max(need + 1, int(need * 1.6))
    return {"num_gpu_blocks": pool, "num_cpu_blocks": max(need, pool // 2),
            "preemption_mode": "swap"}


def _roomy(config: EngineConfig, need: int) -> dict[str, Any]:
    return {"num_gpu_blocks": max(config.num_gpu_blocks, 4 * need + 4),
            "enable_prefix_caching": True}


def _drafting(config: EngineConfig, need: int) -> dict[str, Any]:
    return {**_roomy(config, need), "speculative_method": "ngram", "num_speculative_tokens": 4,
            "prompt_lookup_min": 1 if config.dry else 2}


WORKLOADS: dict[str, Workload] = {
    "preemption (a pool too small)": Workload(tuple(
        (f"Tell a short story about {topic}.", SamplingParams(max_tokens=40, ignore_eos=True))
        for topic in ("a lighthouse", "a lost key", "a paper boat", "the first snow")),
        _preempting, chat=True),
    "a shared prefix (one system prompt)": Workload(tuple(
        (q, SamplingParams(max_tokens=12))
        for q in ("What is paging?", "Why fixed-size blocks?", "What does a page table map?",
                  "When is a block copied?")), _roomy, SYSTEM, chat=True),
    "beams and samples": Workload((
        ("The best way to learn a language is", SamplingParams(max_tokens=12, beam_width=3)),
        ("Once upon a time", SamplingParams(max_tokens=12, n=4, temperature=0.8, seed=7))),
        _roomy),
    "drafts (speculative decoding)": Workload((
        (LIST, SamplingParams(max_tokens=40)),
        ("The history of paged memory begins with", SamplingParams(max_tokens=24))), _drafting),
}


def load(name: str, session: Session) -> Session:
    """A new session running workload `name` on the session's model and block size."""
    work = WORKLOADS.get(name)
    if work is None:
        raise UserError(f"choose a workload: {'; '.join(WORKLOADS)}")
    base = session.config
    prompts = [_prompt(work, text, session.engine) for text, _ in work.requests]
    lengths = [len(p) if isinstance(p, tuple) else len(session.engine.encode(p)) for p in prompts]
    bs = base.block_size
    need = max(-(-(n + sp.max_tokens) // bs) for n, (_, sp) in zip(lengths, work.requests, strict=True))
    try:
        config = dataclasses.replace(base, **work.settings(base, need))
    except (TypeError, ValueError) as err:
        raise UserError(f"this workload cannot run on this engine: {err}") from err
    limits.check_config(config)
    new = session.fresh(config)
    for prompt, (_, params) in zip(prompts, work.requests, strict=True):
        new.run(ops.AddRequest(prompt, params))
    if new.view_choice == "none":
        new.view_choice = "timeline"
    return new


def _prompt(work: Workload, text: str, engine: Any) -> str | tuple[int, ...]:
    """A request's prompt: an instruction in the model's chat template (what a served chat model
    sees: on the bare text SmolLM2 answers its end-of-turn token at once, and every output began
    with it), after the workload's system prompt; a completion, or the dry mode's (which has no
    template), as text."""
    ids = chat_prompt(engine.tokenizer, text, work.system) if work.chat else None
    return work.system + text if ids is None else tuple(ids)
