"""engine/core (the bookkeeping) and engine/describe (what describes a run) are pure Python:
`import engine.core`, `import engine.describe` and every module in them work in a fresh
interpreter where importing torch or numpy raises ImportError (what their __init__.py files and
the README promise). The rest of the layering is tests/test_layering.py's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

#: the start of a script in which importing torch or numpy (or their submodules) raises
BLOCK_TORCH = """
import importlib, pkgutil, sys

class Blocker:
    # a meta-path finder first in line: torch and numpy (and their submodules) cannot be found
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "numpy"):
            raise ImportError(f"blocked by the test: {name}")
        return None

sys.meta_path.insert(0, Blocker())
"""

BLOCKED_IMPORT = BLOCK_TORCH + """
for name in ("torch", "numpy"):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"the blocker let {name} through")

import engine.core, engine.describe
names = [m.name for m in pkgutil.walk_packages(engine.core.__path__, "engine.core.")]
described = [m.name for m in pkgutil.walk_packages(engine.describe.__path__, "engine.describe.")]
for name in names + described:
    importlib.import_module(name)
print(len(names), len(described), "modules")
"""


def test_engine_core_imports_without_torch_and_numpy() -> None:
    proc = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    core, described = map(int, proc.stdout.split()[:2])
    assert core >= 10 and described >= 7  # the walk found both packages' modules
