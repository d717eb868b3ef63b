"""The README's Space front matter pins the Python the tests run on (issue 23, point 8)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _front_matter() -> dict:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("---\n"), "README.md starts with the Space's front matter"
    end = text.index("\n---\n", 4)
    return yaml.safe_load(text[4:end])


def test_python_version_is_pinned_to_the_tested_one():
    meta = _front_matter()
    # a string: YAML would read 3.10 as the float 3.1
    version = meta.get("python_version")
    assert isinstance(version, str), f"python_version must be a quoted string, got {version!r}"
    assert re.fullmatch(r"3\.\d+", version), version
    tested = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert version == tested, (
        f"the Space would run Python {version}; the tests run on {tested}")


def test_pinned_python_satisfies_requires_python():
    version = _front_matter()["python_version"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    minimum = re.search(r'requires-python\s*=\s*">=\s*(\d+)\.(\d+)"', pyproject)
    assert minimum, "pyproject.toml states requires-python as >=X.Y"
    major, minor = (int(p) for p in version.split("."))
    assert (major, minor) >= (int(minimum.group(1)), int(minimum.group(2)))
