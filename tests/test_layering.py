"""The project's layering, read from the source with `ast` (nothing is imported): no module-level
import circle among the packages, and the heavy libraries only where their layer lives.

Rules (module-level imports; an import inside a function is a deliberate lazy load):
- no circle among engine, paged_kernels, history, viz, ui, lessons, classroom, bench and app.py;
- no upward import, at any level: paged_kernels < engine < history, viz < lessons < classroom < ui <
  app.py < bench (LAYERS);
- torch and numpy only in engine/runtime, engine/tp, paged_kernels and bench (engine/core proves it
  imports neither with the two blocked: tests/engine/core/test_torch_free.py);
- plotly only in viz (the figures); gradio only in ui and app.py (the page);
- bench may import the product, never tests; the product imports neither (at any level): tests
  may import bench, the code a smoke test checks, but not the other way round;
- engine/core (the bookkeeping) never imports engine/describe (what describes a run: snapshot,
  sentences, timeline, tree, memory, baselines), at any level: the describing room sits above it.
- no top-level package of ours named like an installed distribution's module: run from the
  repository, ours would shadow it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "paged_kernels", "history", "viz", "ui", "lessons", "classroom", "bench")
PRODUCT = ("engine", "paged_kernels", "history", "viz", "ui", "lessons", "classroom", "app")
# each layer imports only from the layers below it (lower numbers), at any level
LAYERS = {"paged_kernels": 0, "engine": 1, "history": 2, "viz": 2, "lessons": 3, "classroom": 4,
          "ui": 5, "app": 6, "bench": 7}

# library -> the module prefixes that may import it at module level
HEAVY = {
    "torch": ("engine.runtime", "engine.tp", "paged_kernels", "bench"),
    "numpy": ("engine.runtime", "engine.tp", "paged_kernels", "bench"),
    "plotly": ("viz",),
    "gradio": ("ui", "app"),
}


@dataclass(frozen=True)
class Import:
    """One import statement of a module: the module it names and whether it runs at import."""

    target: str
    names: tuple[str, ...]
    module_level: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_files() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name (bench is a namespace package)."""
    files = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}
    files["app"] = ROOT / "app.py"
    return files


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(body: list[ast.stmt], module_level: bool) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement under `body`, with whether it runs when the module is imported:
    `if`/`try`/`with` blocks at the top run, function bodies and `if TYPE_CHECKING:` do not."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, module_level
        elif isinstance(node, ast.If):
            yield from _statements(node.body, module_level and not _is_type_checking(node.test))
            yield from _statements(node.orelse, module_level)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _statements(block, module_level)
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            yield from _statements(node.body, module_level)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # a class body runs at import; a function body does not
            yield from _statements(node.body, module_level and isinstance(node, ast.ClassDef))


def imports(name: str, path: Path) -> list[Import]:
    """The imports of one module, relative ones resolved to absolute names."""
    tree = ast.parse(path.read_text(), str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = []
    for node, module_level in _statements(tree.body, True):
        if isinstance(node, ast.Import):
            out += [Import(a.name, (), module_level) for a in node.names]
            continue
        target = node.module or ""
        if node.level:
            base = package[:len(package) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        out.append(Import(target, tuple(a.name for a in node.names), module_level))
    return out


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports at module level (`from pkg import mod` counts as
    importing the submodule `pkg.mod` where that is a module, else `pkg` itself)."""
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps = set()
        for imp in imports(name, path):
            if not imp.module_level:
                continue
            subs = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in files]
            if subs:
                deps.update(subs)
            if len(subs) < len(imp.names) or not imp.names:
                parts = imp.target.split(".")
                while parts and ".".join(parts) not in files:
                    parts.pop()
                if parts:
                    deps.add(".".join(parts))
        graph[name] = deps - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


FILES = project_files()


def test_the_graph_sees_the_project() -> None:
    """The walk is not vacuous: it finds the engine's own module-level imports."""
    graph = import_graph(FILES)
    assert "engine.llm_engine" in graph["engine"]
    assert any(dep.startswith("engine.core.") for dep in graph["engine.llm_engine"])
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_level_import_circle() -> None:
    cycle = find_cycle(import_graph(FILES))
    assert cycle is None, "module-level import circle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("library", sorted(HEAVY))
def test_heavy_libraries_only_in_their_layer(library: str) -> None:
    allowed = HEAVY[library]
    offenders = sorted(
        name for name, path in FILES.items()
        if not any(name == p or name.startswith(p + ".") for p in allowed)
        and any(imp.module_level and imp.target.split(".")[0] == library for imp in imports(name, path)))
    assert not offenders, f"{library} imported at module level outside {allowed}: {offenders}"


def test_no_layer_imports_one_above_it() -> None:
    offenders = []
    for name, path in FILES.items():
        rank = LAYERS[name.split(".")[0]]
        offenders += [f"{name} imports {imp.target}" for imp in imports(name, path)
                      if LAYERS.get(imp.target.split(".")[0], -1) > rank]
    assert not offenders, "upward imports: " + ", ".join(offenders)


def test_the_bookkeeping_never_imports_the_describing_room() -> None:
    core = [name for name in FILES if name == "engine.core" or name.startswith("engine.core.")]
    assert len(core) > 10 and any(n.startswith("engine.describe.") for n in FILES)
    offenders = [f"{name} imports {imp.target}" for name in core for imp in imports(name, FILES[name])
                 if imp.target == "engine.describe" or imp.target.startswith("engine.describe.")
                 or (imp.target == "engine" and "describe" in imp.names)]
    assert not offenders, offenders


def test_bench_and_product_never_import_tests_and_product_never_imports_bench() -> None:
    offenders = []
    for name, path in FILES.items():
        forbidden = ("tests",) if name.startswith("bench") else ("tests", "bench")
        offenders += [f"{name} imports {imp.target}" for imp in imports(name, path)
                      if imp.target.split(".")[0] in forbidden]
    assert not offenders, offenders


def test_no_package_of_ours_takes_the_name_of_an_installed_one() -> None:
    """A top-level package of ours named like another distribution's module shadows it for
    everyone run from the repository (`python app.py` puts the root first on sys.path, a
    bench script its folder).
    transformers 5.25 began to require and import Hugging Face's `kernels`: our folder of that
    name made every model class fail to import, the default model's included."""
    from importlib.metadata import packages_distributions

    owners = packages_distributions()
    # a bench script runs with bench/ first on sys.path: its file names are top-level there
    scripts = tuple(p.stem for p in (ROOT / "bench").glob("*.py"))
    taken = {pkg: owners[pkg] for pkg in (*PRODUCT, "tests", *scripts)
             if set(owners.get(pkg, ())) - {"pagedlab"}}
    assert not taken, f"these names belong to installed distributions too: {taken}"
