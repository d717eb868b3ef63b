"""`python app.py --model NAME_OR_PATH` offers one more model beside the built-in ones; without
the flag a session cannot name it (a public deployment keeps its three engines)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ui.app_process import ROOT

PROBE = textwrap.dedent("""
    import sys
    from engine import ops
    from ui.render import render
    from ui.session import Session
    from ui.settings_panel import MODES, engine_config
    label = next(k for k, v in MODES.items() if v == sys.argv[1])
    session = Session(engine_config(label, 4, 16, True, "cpu"))
    session.run(ops.AddSequence(prompt="Hello there"))
    print("STATUS", render(session)[-1])
""")


def _run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PAGEDLAB_WARMUP": "never", **env}, timeout=300)


@pytest.fixture(scope="module")
def own_model(tmp_path_factory, tiny_model) -> str:
    folder = tmp_path_factory.mktemp("my-llama")
    tiny_model.model.save_pretrained(folder)
    tiny_model.tokenizer.save_pretrained(folder)
    return str(folder)


def test_the_flag_offers_the_model_and_the_status_line_names_it(own_model):
    done = _run({"PAGEDLAB_MODEL": own_model}, "-c", PROBE, own_model)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"STATUS model: {os.path.basename(own_model)}" in done.stdout


def test_without_the_flag_the_model_is_refused(own_model):
    done = _run({"PAGEDLAB_MODEL": ""}, "-c", PROBE, own_model)
    assert done.returncode != 0 and "StopIteration" in done.stderr  # not among the engines
    from engine import EngineConfig
    from ui.limits import UserError, check_config

    with pytest.raises(UserError, match="not available here"):
        check_config(EngineConfig(model=own_model, block_size=4, num_gpu_blocks=16))


def test_a_model_that_cannot_load_stops_the_app_with_the_reason(tmp_path):
    done = _run({}, "app.py", "--model", str(tmp_path / "no-such-model"), "--port", "1")
    assert done.returncode != 0
    assert "cannot load --model" in done.stderr and "no-such-model" in done.stderr
