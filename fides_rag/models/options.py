"""The model-loading options every `fides-rag` command that loads a model shares: --device, --dtype,
--device-map (a model split over several devices by accelerate) and --offload-folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def parse_device_map(value: str) -> str | dict[str, Any]:
    """An accelerate strategy name, an inline JSON object {module: device}, or a .json file holding one."""
    if value in DEVICE_MAP_STRATEGIES:
        return value
    text = value
    if value.endswith(".json"):
        try:
            text = Path(value).read_text(encoding="utf-8")
        except OSError as err:
            raise argparse.ArgumentTypeError(
                f"cannot read the device map file {value!r}: {err.strerror or err}"
            ) from None
    try:
        mapping = json.loads(text)
    except ValueError:
        mapping = None
    if not isinstance(mapping, dict) or not mapping or not all(isinstance(d, (str, int)) for d in mapping.values()):
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(DEVICE_MAP_STRATEGIES)}, a JSON object of module -> device "
            f'(e.g. \'{{"model.layers.0": 0, "lm_head": "cpu"}}\') or a .json file holding one; got {value!r}'
        )
    return mapping


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --device, --dtype, --device-map and --offload-folder to a sub-command's parser."""
    parser.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="weights' dtype (auto: bfloat16 on CUDA, float32 on CPU)"
    )
    parser.add_argument(
        "--device-map",
        type=parse_device_map,
        default=None,
        metavar="MAP",
        help="split the model over the available devices with accelerate: auto, balanced, "
        "balanced_low_0, sequential, or a JSON {module: device} (inline or a .json file); "
        "replaces --device (e.g. a 70B model over several GPUs)",
    )
    parser.add_argument(
        "--offload-folder", default=None, metavar="DIR", help="where --device-map puts the weights it offloads to disk"
    )


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `load_model` / `FidesDecoder.from_pretrained` from parsed model arguments."""
    if args.offload_folder is not None and args.device_map is None:
        raise ValueError("--offload-folder only applies with --device-map; add --device-map auto or drop it")
    options: dict[str, Any] = {"device": args.device, "dtype": None if args.dtype == "auto" else args.dtype}
    if args.device_map is not None:
        options["device_map"] = args.device_map
    if args.offload_folder is not None:
        options["offload_folder"] = args.offload_folder
    return options
