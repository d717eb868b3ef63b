"""engine/core is pure Python: `import engine.core` and every module in it work in a fresh
interpreter where importing torch or numpy raises ImportError (what engine/core/__init__.py and
the README promise). The rest of the layering is tests/test_layering.py's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

BLOCKED_IMPORT = """
import importlib, pkgutil, sys

class Blocker:
    # a meta-path finder first in line: torch and numpy (and their submodules) cannot be found
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "numpy"):
            raise ImportError(f"blocked by the test: {name}")
        return None

sys.meta_path.insert(0, Blocker())
for name in ("torch", "numpy"):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"the blocker let {name} through")

import engine.core
names = [m.name for m in pkgutil.walk_packages(engine.core.__path__, "engine.core.")]
for name in names:
    importlib.import_module(name)
print(len(names), "modules")
"""


def test_engine_core_imports_without_torch_and_numpy() -> None:
    proc = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert int(proc.stdout.split()[0]) >= 10  # the walk found engine/core's modules
