"""The package's import graph: data flows one way. No module under fides_rag/generation/ imports the facade
(`fides_rag.decoder`), not even under TYPE_CHECKING, no import circle exists between fides_rag modules, and the
facade is the one way into the engine: nothing else in the repository imports the engine's rooms."""

from __future__ import annotations

import ast
from pathlib import Path

import fides_rag

ROOT = Path(fides_rag.__file__).parent
REPOSITORY = ROOT.parent
ENGINE_ROOMS = {f"fides_rag.generation.{room}" for room in
                ("engine", "scheduler", "in_flight", "running", "tickets", "prefilling", "prefix_cache", "step")}
"""The engine and what only it drives; `fides_rag.decoder` is the one door to them."""


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


def test_only_the_facade_and_generation_import_the_engine():
    """Eval, benchmarks, the server, the integrations and the tests reach the engine through `FidesDecoder` (`submit`,
    `configure`, `limits`, `stats`, `around_steps`); the generation room's own tests may open it."""
    allowed = [ROOT / "generation", ROOT / "decoder.py", REPOSITORY / "tests" / "generation"]
    sources = [p for folder in ("fides_rag", "benchmarks", "examples", "integrations", "tests") for p in (REPOSITORY / folder).rglob("*.py")]
    assert len(sources) > 100
    doors = {}
    for path in sources:
        if any(path == a or a in path.parents for a in allowed):
            continue
        rooms = {m for m in imports_of(path) if any(m == r or m.startswith(f"{r}.") for r in ENGINE_ROOMS)}
        if rooms:
            doors[str(path.relative_to(REPOSITORY))] = sorted(rooms)
    assert doors == {}


def test_the_engine_is_not_a_public_name(tiny_llama, tokenizer):
    assert "DecodeEngine" not in fides_rag.__all__ and not hasattr(fides_rag, "DecodeEngine")
    assert not hasattr(fides_rag.FidesDecoder(tiny_llama, tokenizer), "engine")


def test_the_package_top_level_holds_at_most_ten_modules():
    top = sorted(p.name for p in Path(fides_rag.__file__).parent.glob("*.py"))
    assert len(top) <= 10, top
