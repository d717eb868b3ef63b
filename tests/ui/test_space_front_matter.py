"""The README's Space front matter and requirements.txt are what a Space builds (issue 23 point 8,
issue 33): a Python and a torch that ZeroGPU supports (hub-docs spaces-zerogpu.md: Python 3.10.13
or 3.12.12, torch 2.8.0 to 2.11.0), `spaces` named, Gradio the SDK's own version, the default
model preloaded from the hub. tests/space/test_python_versions.py runs the code under that Python."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from engine.runtime.models import DEFAULT_HUB_ID

ROOT = Path(__file__).resolve().parents[2]
ZEROGPU_PYTHONS = ("3.10.13", "3.12.12")
ZEROGPU_TORCH = ((2, 8, 0), (2, 11, 0))


def _front_matter() -> dict:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("---\n"), "README.md starts with the Space's front matter"
    end = text.index("\n---\n", 4)
    return yaml.safe_load(text[4:end])


def _requirements() -> dict[str, str]:
    """name -> its version specifier, from requirements.txt."""
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, spec = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", line).groups()
            pins[name.lower()] = spec
    return pins


def test_the_space_runs_a_python_zerogpu_supports():
    meta = _front_matter()
    version = meta.get("python_version")  # a string: YAML would read 3.10 as the float 3.1
    assert isinstance(version, str) and version in ZEROGPU_PYTHONS, version
    pyproject = (ROOT / "pyproject.toml").read_text()
    minimum = re.search(r'requires-python\s*=\s*">=\s*(\d+)\.(\d+)"', pyproject)
    assert minimum, "pyproject.toml states requires-python as >=X.Y"
    assert tuple(int(p) for p in version.split(".")[:2]) >= tuple(int(g) for g in minimum.groups())
    assert meta["sdk"] == "gradio" and meta["app_file"] == "app.py"


def test_requirements_pin_a_torch_zerogpu_supports_and_name_spaces():
    pins = _requirements()
    torch = re.fullmatch(r"==(\d+)\.(\d+)\.(\d+)", pins["torch"])
    assert torch, f"torch is pinned to one release, got {pins['torch']!r}"
    low, high = ZEROGPU_TORCH
    assert low <= tuple(int(g) for g in torch.groups()) <= high
    assert pins["spaces"].startswith("==")
    assert pins["gradio"] == "==" + str(_front_matter()["sdk_version"])  # the SDK's own Gradio
    assert {"transformers", "plotly", "xxhash", "pyyaml", "segno"} <= set(pins)


def test_the_default_model_is_preloaded_from_the_hub():
    preload = _front_matter()["preload_from_hub"]
    repo, files = preload[0].split()
    assert repo == DEFAULT_HUB_ID
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files.split(","))
