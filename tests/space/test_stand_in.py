"""The stand-in `spaces` package (tests/space_sim) really enforces ZeroGPU's contract, checked in
processes of their own (it patches torch for its whole process): CUDA initialised before it
stops the import; CUDA's initialisation raises in the main process, where is_available() says
True as ZeroGPU's emulation does; a GPU call runs in a forked child that sees the machine's own
torch, its arguments and result pickled; a gr.Error keeps its sentence and any other exception
is named by its class only; a call that outlives its duration is killed; a duration over the
maximum or over the quota left is refused before anything runs; every call is logged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ui.app_process import ROOT

pytestmark = pytest.mark.slow  # two interpreters importing torch, a call killed after 1 s


def probe(tmp_path, *argv: str) -> dict:
    log = tmp_path / "sim.log"
    env = {**os.environ, "SPACES_ZERO_GPU": "true", "PYTHONPATH": os.path.join(ROOT, "tests", "space_sim"),
           "SPACES_SIM_LOG": str(log), "SPACES_SIM_QUOTA_SECONDS": "5",
           "SPACES_SIM_MAX_DURATION": "8", "SPACES_SIM_GRACE_SECONDS": "0.5"}
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "space", "stand_in_probe.py"),
                           *argv], env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)
    line = next((x for x in done.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line, done.stdout + done.stderr
    return json.loads(line.removeprefix("PROBE "))


def test_cuda_initialised_before_the_import_stops_it(tmp_path):
    assert probe(tmp_path, "bad-fork")["import_error"] == (
        "CUDA has been initialized before importing the `spaces` package. "
        "Try importing `spaces` before any other CUDA-related package.")


def test_the_stand_in_forks_pickles_maps_kills_and_refuses(tmp_path):
    out = probe(tmp_path)
    assert out["main_is_available"] is True  # emulated in the main process, as on ZeroGPU
    assert "CUDA init" in out["main_cuda_tensor"]["message"]  # and a real init raises
    pid, child_sees_cuda, doubled = out["call"]["value"]
    assert pid != out["parent_pid"] and child_sees_cuda is False and doubled == 42  # forked
    assert out["unpicklable_argument"]["error"] in ("PicklingError", "AttributeError")
    assert out["gradio_error"]["message"] == "the prompt is 1,500 tokens; the most is 1,024"
    assert out["value_error"] == {"error": "Error", "title": "ZeroGPU worker error",
                                  "message": "ValueError"}  # the sentence is lost
    assert out["unpicklable_result"]["title"] == "ZeroGPU worker error"
    assert out["overrun"]["message"] == "GPU task aborted" and out["overrun"]["seconds"] < 10
    assert out["over_max"]["title"] == "ZeroGPU illegal duration"
    assert out["over_quota"]["title"] == "ZeroGPU quota exceeded"
    assert "(4s requested vs." in out["over_quota"]["message"]
    log = out["log"]
    assert log[0] == {**log[0], "event": "import", "torch_imported_before": False}
    assert [e["event"] for e in log].count("cuda_init") == 1  # the one placement on cuda, above
    calls = [e for e in log if e["event"] == "call"]
    assert [c["outcome"] for c in calls] == ["ok", "error", "error", "error", "aborted"]
    assert calls[-1]["requested"] == 1 and 1 <= calls[-1]["used"] < 5
    assert [e["event"] for e in log[-2:]] == ["refused", "refused"]
