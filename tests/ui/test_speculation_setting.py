"""The Settings' speculative decoding choice: Apply starts a session whose engine drafts, the
engine's description says so, and a finished request in Serving tells how many drafts it kept."""

from __future__ import annotations

import pytest

from engine import SamplingParams, ops
from ui.limits import UserError
from ui.render import render
from ui.session import Session
from ui.settings_panel import DRAFT_CHOICES, engine_config, with_drafts

REPEATS = ("The cat sat on the mat and looked at the dog. The cat sat on the mat and looked at "
           "the dog. The cat sat on the")


def test_the_setting_turns_prompt_lookup_on_and_off() -> None:
    dry = engine_config("dry (bookkeeping only, no model)", 4, 32, True, "cpu")
    assert with_drafts(dry, 0) is dry
    on = with_drafts(dry, 4)
    assert (on.speculative_method, on.num_speculative_tokens) == ("ngram", 4)
    assert 0 in DRAFT_CHOICES
    with pytest.raises(UserError, match="draft tokens must be a whole number from 0 to 8"):
        with_drafts(dry, 2.5)


@pytest.mark.model
def test_a_served_request_says_how_many_drafts_it_kept(default_model) -> None:
    config = with_drafts(engine_config("SmolLM2-135M (real model)", 4, 64, True, "cpu"), 4)
    s = Session(config)
    s.run(ops.AddRequest(REPEATS, SamplingParams(max_tokens=12, ignore_eos=True)))
    for _ in range(12):
        s.run(ops.Step())
    assert s.engine.engine_info()["speculative decoding"] == "ngram, up to 4 draft tokens"
    done = s.engine.finished_requests()[0]
    assert done.accepted_tokens > 0
    texts = render(s)[2]
    assert f"drafts: {done.accepted_tokens} of {done.draft_tokens} kept" in texts
