"""The package's import graph: data flows one way. Every fides_rag module belongs to a layer, and no import runs from
a lower layer up (`LAYERS`); no module under fides_rag/generation/ imports the facade (`fides_rag.decoder`), not even
under TYPE_CHECKING; no import circle exists between fides_rag modules; and the front doors (the server, eval, the
demo, the CLI, benchmarks, examples, the integrations) reach the engine only through `fides_rag`, the decoder and the
call layer (`fides_rag.calls`): none imports any module of `fides_rag.generation`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import fides_rag

ROOT = Path(fides_rag.__file__).parent
REPOSITORY = ROOT.parent
ENGINE = "fides_rag.generation.engine"
"""The engine's folder: `fides_rag.decoder` is the one door to it from outside `fides_rag.generation`."""


LAYERS: list[tuple[str, ...]] = [
    (
        "fides_rag.errors",
        "fides_rag.registry",
        "fides_rag.extras",
        "fides_rag.result",
        "fides_rag.report",
        "fides_rag.models",
        "fides_rag.prompts",
    ),
    ("fides_rag.method",),
    ("fides_rag.rules",),
    ("fides_rag.generation",),
    ("fides_rag.decoder", "fides_rag"),  # the package's own names are the facade's
    ("fides_rag.calls",),
    ("fides_rag.serve", "fides_rag.eval", "fides_rag.demo", "fides_rag.cli", "fides_rag.testing"),
]
"""The layers from the bottom up: a module may import its own layer and those below, never one above."""
FRONT_DOORS = [
    ROOT / "serve",
    ROOT / "eval",
    ROOT / "demo",
    ROOT / "cli",
    REPOSITORY / "benchmarks",
    REPOSITORY / "examples",
    REPOSITORY / "integrations",
]
"""What reaches the engine only through `fides_rag`, the decoder and the call layer."""
ROOM_BENCHMARKS = {REPOSITORY / "benchmarks" / "grammar_step_cost.py"}
"""Micro-benchmarks of one generation room on its own (no decoder, no call): they time the room's functions."""


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest prefix naming `module` (a package names itself and its modules)."""
    best, found = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or (prefix != "fides_rag" and module.startswith(f"{prefix}."))
            if matches and len(prefix) > best:
                best, found = len(prefix), index
    if found < 0:
        raise AssertionError(f"{module} belongs to no layer; add it to LAYERS")
    return found


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """Every fides_rag module `path` imports anywhere in its body (TYPE_CHECKING blocks and functions too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = module_name(path, root) if root in path.parents else ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fides_rag")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
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


def test_every_import_runs_down_the_layers():
    upward = {name: sorted(t for t in targets if layer_of(t) > layer_of(name)) for name, targets in graph().items()}
    assert {name: targets for name, targets in upward.items() if targets} == {}


def test_the_layer_check_catches_an_upward_import(tmp_path):
    assert (
        layer_of("fides_rag.method.signals")
        < layer_of("fides_rag.rules.fides")
        < layer_of("fides_rag.generation.engine.engine")
    )
    assert (
        layer_of("fides_rag.generation.engine.engine")
        < layer_of("fides_rag.decoder")
        < layer_of("fides_rag.calls.answering")
    )
    assert layer_of("fides_rag.calls") < layer_of("fides_rag.serve.app") == layer_of("fides_rag.eval.bench")
    assert layer_of("fides_rag") == layer_of("fides_rag.decoder") and layer_of("fides_rag.errors") == 0
    module = tmp_path / "fides_rag" / "method" / "sneaky.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "def f():\n    from fides_rag.rules.fides import FidesRule\n    from fides_rag import __version__\n"
    )
    known = set(graph())
    found = {
        m
        for m in imports_of(module, tmp_path / "fides_rag")
        if m in known and layer_of(m) > layer_of("fides_rag.method.sneaky")
    }
    assert found == {"fides_rag", "fides_rag.rules.fides"}


def test_front_doors_never_import_the_generation_package():
    sources = [p for folder in FRONT_DOORS for p in folder.rglob("*.py") if p not in ROOM_BENCHMARKS]
    assert len(sources) > 80
    doors = {
        str(p.relative_to(REPOSITORY)): sorted(
            m for m in imports_of(p) if m == "fides_rag.generation" or m.startswith("fides_rag.generation.")
        )
        for p in sources
    }
    assert {path: modules for path, modules in doors.items() if modules} == {}


def test_only_the_facade_and_generation_import_the_engine():
    """Eval, benchmarks, the server, the integrations and the tests reach the engine through `FidesDecoder` (`submit`,
    `configure`, `limits`, `stats`, `around_steps`); the engine's own tests may open it."""
    allowed = [ROOT / "generation", ROOT / "decoder.py", REPOSITORY / "tests" / "generation" / "engine"]
    sources = [
        p
        for folder in ("fides_rag", "benchmarks", "examples", "integrations", "tests")
        for p in (REPOSITORY / folder).rglob("*.py")
    ]
    assert len(sources) > 100
    doors = {}
    for path in sources:
        if any(path == a or a in path.parents for a in allowed):
            continue
        rooms = {m for m in imports_of(path) if m == ENGINE or m.startswith(f"{ENGINE}.")}
        if rooms:
            doors[str(path.relative_to(REPOSITORY))] = sorted(rooms)
    assert doors == {}


def test_the_engine_is_not_a_public_name(tiny_llama, tokenizer):
    assert "DecodeEngine" not in fides_rag.__all__ and not hasattr(fides_rag, "DecodeEngine")
    assert not hasattr(fides_rag.FidesDecoder(tiny_llama, tokenizer), "engine")


def test_the_package_top_level_holds_at_most_ten_modules():
    top = sorted(p.name for p in Path(fides_rag.__file__).parent.glob("*.py"))
    assert len(top) <= 10, top


def test_every_public_name_loads_on_first_use_as_its_modules_object():
    import fides_rag.decoder
    import fides_rag.errors

    for name in fides_rag.__all__:
        assert getattr(fides_rag, name) is not None, name
    assert fides_rag.FidesDecoder is fides_rag.decoder.FidesDecoder
    assert fides_rag.KVPoolExceeded is fides_rag.errors.KVPoolExceeded
    assert set(fides_rag.__all__) <= set(dir(fides_rag))
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        fides_rag.NoSuchName  # noqa: B018


def test_reading_results_loads_neither_transformers_nor_the_engine():
    """Scripts that read runs (scale_trend, signal_clips, no_stop_anatomy) start without transformers; the rules
    load without it too (DVD imports its nucleus filter where it runs)."""
    code = (
        "import sys, fides_rag, fides_rag.eval.records, fides_rag.eval.failures, fides_rag.eval.strata_run, "
        "fides_rag.rules; print(sorted(m for m in ('transformers', 'fides_rag.decoder', "
        "'fides_rag.generation.engine') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
