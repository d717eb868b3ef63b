"""A closed face: nothing outside engine/ reads the engine's insides or calls its private
dispatcher. The UI, the lessons, the classroom, the figures and app.py go through LLMEngine's
public methods (engine/llm_engine.py: apply, snapshot, requests, pool_size, ...)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CALLERS = ["ui", "lessons", "classroom", "viz", "app.py"]
# the reach-ins issue 20 names: the private dispatcher, the cache manager, the scheduler, the
# runtime, the request groups; and any private attribute of an engine (issue 40)
FORBIDDEN = re.compile(r"\._apply\(|\.kv\.|\.scheduler\.|\.runtime\.|\.groups\b"
                       r"|\b(eng|engine)\._[a-z]")


def _caller_files() -> list[Path]:
    files: list[Path] = []
    for name in CALLERS:
        path = ROOT / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def test_no_caller_reaches_into_the_engine() -> None:
    hits = [f"{f.relative_to(ROOT)}:{i}: {line.strip()}"
            for f in _caller_files()
            for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
            if FORBIDDEN.search(line)]
    assert not hits, "reach-ins past the engine's face:\n" + "\n".join(hits)


def test_the_grep_sees_what_it_must_refuse() -> None:
    for line in ("eng._apply(op)", "eng.kv.pool.num_blocks", "eng.scheduler.has_work()",
                 "eng.runtime.loaded", "eng.groups[rid]", "x = eng._trace", "engine._flight"):
        assert FORBIDDEN.search(line), line
    for line in ("eng.apply(op)", "eng.pool_size()", "eng.has_pending_work()", "eng.requests()",
                 "eng.vocab_size", "eng.max_model_len"):
        assert not FORBIDDEN.search(line), line
