"""The Space's code runs under the Pythons ZeroGPU supports (3.10.13, named in the README's front
matter, and 3.12), taken from pyenv where the machine has them (skipped where it has not): every
file the Space runs compiles there, and the part that needs no torch (torch cannot be installed
for them on this machine) imports and runs for real in a small venv of that Python (xxhash,
PyYAML, NumPy, pyzmq, msgspec): the whole engine in dry mode (paged bookkeeping, serving,
sampling, swaps), the lessons player through the dry lessons with every check, and the classroom's rooms."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
#: where the small venvs live between runs (made on first use, from PyPI)
VENVS = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pagedlab" / "python-checks"
SPACE_CODE = ["app.py", "engine", "paged_kernels", "history", "viz", "ui", "lessons", "classroom",
              "tests/space_sim"]

COMPILE = """
import pathlib, sys
files = [p for root in sys.argv[1:] for p in
         (sorted(pathlib.Path(root).rglob("*.py")) if pathlib.Path(root).is_dir() else [pathlib.Path(root)])]
for p in files:
    compile(p.read_text(encoding="utf-8"), str(p), "exec")  # no .pyc written
print(len(files))
"""

RUN = """
import importlib, pathlib, sys
from engine import EngineConfig, LLMEngine, SamplingParams
from lessons import LessonRun, load_all
from classroom import RoomRegistry
names = [".".join(p.with_suffix("").parts).removesuffix(".__init__")
         for pkg in ("engine/core", "engine/dry", "lessons", "classroom")
         for p in sorted(pathlib.Path(pkg).rglob("*.py"))]
for name in names + ["engine.ops", "engine.llm_engine", "engine.checkpoint"]:
    importlib.import_module(name)
eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=12, num_cpu_blocks=8,
                             preemption_mode="swap"))
seq = eng.add_sequence("Four score and seven years ago")
child = eng.fork(seq)
eng.append(seq, token_ids=[1, 2, 3])
eng.free(seq)
eng.free(child)
outs = eng.generate(["hello", "paged memory"], SamplingParams(max_tokens=9, n=2, temperature=1.0, seed=1))
eng.check_invariants()
assert len(outs) == 2 and all(len(c.token_ids) == 9 for o in outs for c in o.outputs)
played = 0
for lesson in load_all():
    if lesson.config.model is None:
        run = LessonRun(lesson)
        while not run.done:
            run.next()
        played += 1
rooms = RoomRegistry("cpu")
print(sys.version.split()[0], len(names), played, type(rooms).__name__)
"""


def interpreters() -> list[Path]:
    """3.10.13 exactly (the front matter's) and the newest 3.12 pyenv has."""
    found = []
    if (PYENV / "3.10.13" / "bin" / "python").exists():
        found.append(PYENV / "3.10.13" / "bin" / "python")
    twelve = sorted(PYENV.glob("3.12.*/bin/python"), key=lambda p: [int(x) for x in p.parts[-3].split(".")])
    return found + twelve[-1:]


PYTHONS = interpreters()
pytestmark = pytest.mark.skipif(not PYTHONS, reason="no pyenv Python 3.10.13 or 3.12 here")


@pytest.mark.parametrize("python", PYTHONS, ids=[p.parts[-3] for p in PYTHONS])
def test_every_file_the_space_runs_compiles(python):
    done = subprocess.run([str(python), "-c", COMPILE, *SPACE_CODE], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout) > 120  # the walk found the files


#: the torch-free part of requirements.txt the Space installs (pyzmq and msgspec: the classroom's
#: rooms served by vLLM import engine/vllm/, a client of its KV events)
TORCH_FREE = ["xxhash", "pyyaml", "numpy", "pyzmq", "msgspec"]


def small_venv(python: Path) -> Path:
    """A venv of `python` with the engine's torch-free needs, made once (again when the list
    changes; skipped when PyPI is out of reach)."""
    venv = VENVS / python.parts[-3]
    ready = venv / "ready"
    if not ready.exists() or ready.read_text().split() != TORCH_FREE:
        subprocess.run([str(python), "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
        pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *TORCH_FREE],
                             capture_output=True, text=True, timeout=600)
        if pip.returncode:
            pytest.skip(f"could not install {', '.join(TORCH_FREE)} for {python}: {pip.stderr[-300:]}")
        ready.write_text(" ".join(TORCH_FREE) + "\n")
    return venv / "bin" / "python"


@pytest.mark.slow
@pytest.mark.parametrize("python", PYTHONS, ids=[p.parts[-3] for p in PYTHONS])
def test_the_engine_lessons_and_rooms_run_there_without_torch(python):
    done = subprocess.run([str(small_venv(python)), "-c", RUN], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-3000:]
    version, modules, played, rooms = done.stdout.split()
    assert version.startswith(python.parts[-3][:4]) and int(modules) > 40 and int(played) >= 2
