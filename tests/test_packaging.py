"""The lean core: a wheel built with `python -m build` installs into a fresh venv (torch first) without the extras,
`fides-rag --help` and `import fides_rag` work there, and a command that needs an extra names it instead of a
traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from fides_rag.extras import MissingExtraError, check_extra, require

ROOT = Path(__file__).resolve().parents[1]
# rich is left out: transformers itself brings it (huggingface_hub -> typer -> rich).
EXTRA_MODULES = (
    "pandas",
    "pyarrow",
    "scipy",
    "sklearn",
    "matplotlib",
    "faiss",
    "sentence_transformers",
    "tabulate",
    "llguidance",
)


def test_require_names_the_extra_for_a_missing_module() -> None:
    with pytest.raises(MissingExtraError, match=r'pip install "fides-rag\[demo\]"'):
        require("fides_rag_no_such_module_xyz", "demo")


def test_require_returns_an_installed_module() -> None:
    assert require("json").dumps([1]) == "[1]"


def test_check_extra_passes_when_the_extra_is_installed() -> None:
    pytest.importorskip("pandas")
    check_extra("eval")  # the test environment installs [eval,demo]: nothing to raise


def _run(*args: str | Path, **kwargs) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }  # nothing but the venv's own packages
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=1200, env=env, **kwargs)


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_without_extras(tmp_path: Path) -> None:
    source, dist = tmp_path / "source", tmp_path / "dist"  # build a copy: a build leaves build/ and *.egg-info behind
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".venv",
            ".git",
            "build",
            "dist",
            "*.egg-info",
            "results",
            "integrations",
            ".pytest_cache",
            "__pycache__",
            "runs",
            ".cache",
        ),
    )
    built = _run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, source)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next(dist.glob("fides_rag-*.whl"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    pip = (py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile")  # no .pyc: minutes
    for step in (("torch==2.13.0",), (wheel,)):  # torch first, from the local CPU wheel
        done = _run(*pip, *step)
        assert done.returncode == 0, done.stderr[-3000:]

    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    present = _run(py, "-c", probe, *EXTRA_MODULES)
    assert present.stdout.strip() == "[]", f"extras leaked into the core install: {present.stdout}"

    imported = _run(
        py, "-c", "import fides_rag, fides_rag.cli.main; print(fides_rag.FidesDecoder.__name__)", cwd=tmp_path
    )
    assert imported.returncode == 0 and imported.stdout.strip() == "FidesDecoder", imported.stderr[-3000:]
    helped = _run(env_dir / "bin" / "fides-rag", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "eval" in helped.stdout, helped.stderr[-3000:]

    for command, extra in (("eval", "eval"), ("analyze", "eval"), ("demo", "demo")):
        args = {
            "eval": ("eval", "--dataset", "nq-swap", "--limit", "1", "--out", tmp_path / "run"),
            "analyze": ("analyze", tmp_path),
            "demo": ("demo", "--limit", "1"),
        }[command]
        refused = _run(env_dir / "bin" / "fides-rag", *args, cwd=tmp_path)
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr[-3000:])
        assert f'pip install "fides-rag[{extra}]"' in refused.stderr and "Traceback" not in refused.stderr, (
            refused.stderr
        )
