"""The package's shape, read from its source: the process boundary in the folders (only
``izh_trio/wire`` is imported by both sides), no import cycles, modules of a readable size."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "izh_trio"
#: Lines a module may have; model files (one architecture each) may have more.
MAX_LINES = 300


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``path`` imports anywhere: at module level, inside functions
    (deferred) and under ``TYPE_CHECKING`` alike, since a cycle through any of them still ties
    the two modules together."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def test_the_engine_and_the_frontend_share_only_the_wire() -> None:
    crossing = [
        (name, target) for name, targets in _graph().items() for target in targets
        for side, other in (("frontend", "engine"), ("engine", "frontend"))
        if name.startswith(f"izh_trio.{side}") and target.startswith(f"izh_trio.{other}")
    ]
    assert not crossing, crossing


def test_no_import_cycles() -> None:
    graph = _graph()
    # a module's own package __init__ runs first anyway: an edge to it is no cycle
    edges = {name: {t for t in targets if not name.startswith(t + ".")}
             for name, targets in graph.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def walk(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                walk(target, [*path, target])
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            walk(name, [name])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_modules_are_of_a_readable_size() -> None:
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES
            and ".models." not in name}
    assert not long, long
