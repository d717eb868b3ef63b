"""engine.runtime.models: where weights come from, the disk cache, and the errors a user can run into."""

from __future__ import annotations

import time

import pytest
import torch

from engine.runtime import models
from engine.runtime.models import ModelLoadError, UnsupportedArchitecture, load_model, load_model_uncached

CPU = torch.device("cpu")


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.model
def test_default_loads_offline(default_model):
    m = default_model
    assert m.source.startswith(("cache:", "gguf:")), m.source
    assert (m.num_layers, m.num_q_heads, m.num_kv_heads, m.head_dim) == (30, 9, 3, 64)
    assert m.device == CPU and m.dtype == torch.float32
    assert not m.model.training
    assert not any(p.requires_grad for p in m.model.parameters())
    assert m.tokenizer.eos_token_id in m.eos_token_ids
    ids = m.tokenizer("Four score and seven years ago")["input_ids"]
    assert m.tokenizer.decode(ids) == "Four score and seven years ago"


@pytest.mark.model
def test_process_cache_shares_one_instance(default_model):
    assert load_model("default", device="cpu", dtype="float32") is default_model
    assert load_model("default") is default_model  # "auto" resolves to the same key on a CPU box


@pytest.mark.model
def test_second_load_comes_from_the_disk_cache(default_model):
    start = time.perf_counter()
    again = load_model_uncached("default", CPU, torch.float32)
    seconds = time.perf_counter() - start
    assert again.source.startswith("cache:"), again.source
    assert seconds < 15, f"a cached load took {seconds:.1f} s"
    assert _same_weights(again.model, default_model.model)


def test_kv_bytes_per_token_smollm2(default_model):
    assert default_model.kv_bytes_per_token() == 2 * 30 * 3 * 64 * 4
    assert default_model.kv_bytes_per_token(torch.bfloat16) == 2 * 30 * 3 * 64 * 2


def test_tiny_random_is_deterministic(tiny_model):
    fresh = load_model_uncached("tiny-random", CPU, torch.float32)
    assert _same_weights(fresh.model, tiny_model.model)
    m = tiny_model
    assert (m.num_layers, m.num_q_heads, m.num_kv_heads, m.head_dim) == (2, 3, 1, 64)
    assert m.vocab_size == len(m.tokenizer)
    # Tied embeddings: the LM head is the embedding matrix.
    assert m.model.get_output_embeddings().weight is m.model.get_input_embeddings().weight


def test_tiny_random_leaves_the_global_rng_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    load_model_uncached("tiny-random", CPU, torch.float32)
    assert torch.equal(torch.rand(3), expected)


def test_unknown_name_says_what_was_tried(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no 30 s of network retries in CI
    with pytest.raises(ModelLoadError) as info:
        load_model("no-such-org/pagedlab-no-such-model")
    text = str(info.value)
    assert "no-such-org/pagedlab-no-such-model" in text
    assert "Tried" in text and "local folder" in text and "Hugging Face Hub" in text
    assert "'default'" in text and "'tiny-random'" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_gpu_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="no CUDA GPU"):
        load_model("tiny-random", device="cuda")


def test_bad_device_and_dtype_strings():
    with pytest.raises(ModelLoadError, match="device"):
        load_model("tiny-random", device="tpu")
    with pytest.raises(ModelLoadError, match="dtype"):
        load_model("tiny-random", dtype="int8")


def test_auto_dtype_is_float32_on_cpu():
    assert models.resolve_dtype("auto", CPU) == torch.float32
    assert models.resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16


def test_unsupported_architecture(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedArchitecture) as info:
        load_model(str(tmp_path))
    text = str(info.value)
    assert "unsupported architecture 'gpt2'" in text
    assert "PagedLab supports" in text and "llama" in text


def test_local_llama_folder_loads(tmp_path, tiny_model):
    tiny_model.model.save_pretrained(tmp_path)
    tiny_model.tokenizer.save_pretrained(tmp_path)
    m = load_model_uncached(str(tmp_path), CPU, torch.float32)
    assert m.source.startswith("local folder:")
    assert _same_weights(m.model, tiny_model.model)


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGEDLAB_CACHE", str(tmp_path / "a"))
    assert models.cache_root() == tmp_path / "a"
    monkeypatch.delenv("PAGEDLAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_root() == tmp_path / "xdg" / "pagedlab"


def test_a_failed_cache_write_leaves_nothing_behind(tmp_path, tiny_model):
    class Exploding:
        def save_pretrained(self, folder):
            (folder / "half-written.json").write_text("{")
            raise OSError("killed mid-write")

    target = tmp_path / "model"
    with pytest.raises(OSError, match="killed"):
        models.save_atomically(tiny_model.model, Exploding(), target, source="test")
    assert list(tmp_path.iterdir()) == []


def test_tokenizer_alone_needs_no_weights(monkeypatch, tmp_path, default_model):
    """tiny-random on a fresh machine reads only the tokenizer from the GGUF (no dequantizing)."""
    monkeypatch.setenv("PAGEDLAB_CACHE", str(tmp_path))
    tokenizer = models._load_default_tokenizer()
    assert [p.name for p in tmp_path.iterdir()] == [f"{models.DEFAULT_CACHE_NAME}-tok"]
    text = "PagedAttention pages the KV cache."
    assert tokenizer(text)["input_ids"] == default_model.tokenizer(text)["input_ids"]
