"""A lesson's front matter: the YAML between '---' lines (title, summary, engine, dry_reason,
params), checked so a typo fails with the file and line before a class sees it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from engine import EngineConfig
from lessons.lesson import ENGINE_KEYS, LessonError, Param


def front_matter(path: Path, lines: list[str]) -> tuple[dict[str, Any], int]:
    """The YAML between the first two '---' lines, and the index of the line after it."""
    if not lines or lines[0].strip() != "---":
        raise LessonError(path, 1, "a lesson starts with front matter between '---' lines "
                                   "(title, summary, engine)")
    for end in range(1, len(lines)):
        if lines[end].strip() == "---":
            break
    else:
        raise LessonError(path, 1, "the front matter is not closed with a '---' line")
    try:
        meta = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 2 if mark is not None else 2
        raise LessonError(path, line, f"front matter is not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(meta, dict):
        raise LessonError(path, 2, "the front matter must be 'key: value' lines")
    known = {"title", "summary", "engine", "dry_reason", "params", "view"}
    unknown = sorted(set(meta) - known)
    if unknown:
        raise LessonError(path, 2, f"unknown front matter key(s): {', '.join(unknown)}; "
                                   f"expected {', '.join(sorted(known))}")
    if meta.get("view", "none") not in VIEWS:  # the view under the picture (ui/run_views.py)
        raise LessonError(path, 2, f"'view' must be one of: {', '.join(VIEWS)}; got "
                                   f"{meta['view']!r}")
    return meta, end + 1


#: what a lesson may show under its picture (`view:`): the run over time or the prefix cache
VIEWS = ("none", "timeline", "memory", "prefix tree")

#: characters of a title the lesson dropdown shows whole beside its Start button
MAX_TITLE = 32


def required_str(path: Path, meta: dict[str, Any], key: str) -> str:
    """A front matter key that must hold text (title, summary)."""
    value = meta.get(key)
    if not isinstance(value, str) or not value.strip():
        raise LessonError(path, 2, f"the front matter needs a '{key}' (text)")
    if key == "title" and len(value.strip()) > MAX_TITLE:
        raise LessonError(path, 2, f"the title is {len(value.strip())} characters; the lesson list "
                                   f"shows {MAX_TITLE}: shorten it (the summary holds the rest)")
    return value.strip()


def engine_config(path: Path, meta: dict[str, Any],
                  params: tuple[Param, ...] = ()) -> tuple[EngineConfig, str]:
    """The lesson's engine (keys: EngineConfig's own fields; a param named after one gives its
    default) and why it is dry, if it is."""
    engine = meta.get("engine")
    if not isinstance(engine, dict):
        raise LessonError(path, 2, "the front matter needs an 'engine' mapping (model, block_size, "
                                   "num_gpu_blocks, ...)")
    unknown = sorted(set(engine) - ENGINE_KEYS)
    if unknown:
        raise LessonError(path, 2, f"unknown engine key(s): {', '.join(unknown)}; "
                                   f"expected some of {', '.join(sorted(ENGINE_KEYS))}")
    values = {**{p.name: p.default for p in params if p.name in ENGINE_KEYS}, **engine}
    model = values.get("model", "default")
    if model in ("dry", None):
        values["model"] = None
    dry_reason = str(meta.get("dry_reason") or "").strip()
    if values["model"] is None and not dry_reason:
        raise LessonError(path, 2, "a dry lesson must say why in 'dry_reason' (lessons run on the real "
                                   "model unless there is a reason not to)")
    try:
        config = EngineConfig(**values)
    except (TypeError, ValueError) as e:
        raise LessonError(path, 2, f"bad engine config: {e}") from None
    return config, dry_reason


def params(path: Path, meta: dict[str, Any]) -> tuple[Param, ...]:
    """The choices a learner makes (dropdowns), each with its label and default."""
    raw = meta.get("params") or {}
    if not isinstance(raw, dict):
        raise LessonError(path, 2, "'params' must map a name to {label, choices, default}")
    out = []
    for name, spec in raw.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("choices"), list) or not spec["choices"]:
            raise LessonError(path, 2, f"param {name!r} needs a non-empty 'choices' list")
        default = spec.get("default", spec["choices"][0])
        if default not in spec["choices"]:
            raise LessonError(path, 2, f"param {name!r}: default {default!r} is not one of its choices")
        out.append(Param(str(name), str(spec.get("label", name)), tuple(spec["choices"]), default))
    return tuple(out)


def engine_params(path: Path, config: EngineConfig, params: tuple[Param, ...], meta: dict[str, Any]) -> None:
    """A param named after an engine setting (block_size, num_gpu_blocks, ...) sets it: each of
    its choices must make a valid engine, and the engine mapping, if it names the key too, must
    agree with the param's default."""
    engine = meta.get("engine") or {}
    for p in params:
        if p.name not in ENGINE_KEYS:
            continue
        if p.name in engine and engine[p.name] != p.default:
            raise LessonError(path, 2, f"param {p.name!r} sets the engine's {p.name}: its default "
                                       f"{p.default!r} and the engine's {engine[p.name]!r} differ")
        for choice in p.choices:
            try:
                replace(config, **{p.name: choice})
            except (TypeError, ValueError) as e:
                raise LessonError(path, 2, f"param {p.name!r}: {choice!r} is no engine setting: "
                                           f"{e}") from None
