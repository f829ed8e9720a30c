"""The package's import graph: data flows one way. No module under fides_rag/generation/ imports the facade
(`fides_rag.decoder`), not even under TYPE_CHECKING, and no import circle exists between fides_rag modules."""

from __future__ import annotations

import ast
from pathlib import Path

import fides_rag

ROOT = Path(fides_rag.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every fides_rag module `path` imports anywhere in its body (TYPE_CHECKING blocks and functions too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fides_rag")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.startswith("fides_rag"):
                found.add(base)
                found |= {f"{base}.{a.name}" for a in node.names}
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def test_generation_never_imports_the_facade():
    for name, targets in graph().items():
        if name.startswith("fides_rag.generation"):
            assert "fides_rag.decoder" not in targets, name


def test_no_import_circle():
    edges = graph()
    # a package's __init__ re-exports its modules; an edge into a package means "import its __init__"
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
