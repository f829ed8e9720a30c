"""The `fides-rag` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from fides_rag.config import FidesConfig
from fides_rag.decoder import FidesDecoder
from fides_rag.report import step_table
from fides_rag.rules import available_methods

DEFAULT_MODEL = "gemma3-270m"


def _methods(value: str) -> list[str]:
    methods = [m.strip() for m in value.split(",") if m.strip()]
    unknown = [m for m in methods if m not in available_methods()]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown method(s) {unknown}; available: {', '.join(available_methods())}")
    return methods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fides-rag", description="Faithful RAG decoding with FIDES and its baselines.")
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("methods", help="list the decoding methods")

    generate = commands.add_parser("generate", help="answer one question from documents with one or more methods")
    generate.add_argument("question")
    generate.add_argument("--doc", action="append", default=[], help="a document (repeat for several)")
    generate.add_argument("--model", default=DEFAULT_MODEL, help="bundled alias, hub id, local folder or .gguf file")
    generate.add_argument("--methods", type=_methods, default=["fides"], help="comma-separated, e.g. standard,cad,fides")
    generate.add_argument("--config", help="a FidesConfig JSON file (e.g. from calibration)")
    generate.add_argument("--max-new-tokens", type=int, default=32)
    generate.add_argument("--device", default="auto")
    generate.add_argument("--steps", action="store_true", help="print the per-token alpha and signal table")
    generate.add_argument("--json", action="store_true", help="print results as JSON lines")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "methods":
        print("\n".join(available_methods()))
        return 0
    config = FidesConfig.from_file(args.config) if args.config else FidesConfig()
    decoder = FidesDecoder.from_pretrained(args.model, device=args.device, config=config)
    for method in args.methods:
        result = decoder.generate(args.question, args.doc, method=method, max_new_tokens=args.max_new_tokens)
        if args.json:
            print(json.dumps(result.to_dict()))
            continue
        print(f"{method:>8}: {result.text}")
        for note in result.notes:
            print(f"{'':>10}note: {note}")
        if args.steps:
            print(step_table(result), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
