"""The `fides-rag serve` sub-command: its arguments and its run (uvicorn on the app, loopback by default)."""

from __future__ import annotations

import argparse
import logging
import os
import signal

from fides_rag.decoder import attention_choices
from fides_rag.models.options import add_model_arguments, load_options
from fides_rag.rules import get_method
from fides_rag.serve.defaults import API_KEY_ENV, DEFAULT_MAX_REQUEST_BYTES

DEFAULT_PORT = 8000


def _method(value: str) -> str:
    try:
        get_method(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return number


def _buckets(value: str) -> list[int]:
    try:
        buckets = [int(part) for part in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"takes comma-separated row counts such as 1,2,4,8,16, got {value!r}"
        ) from None
    if any(b < 1 for b in buckets) or any(a >= b for a, b in zip(buckets, buckets[1:])):
        raise argparse.ArgumentTypeError(f"must be strictly increasing positive row counts, got {value!r}")
    return buckets


def add_serve_parser(commands: argparse._SubParsersAction, default_model: str) -> None:
    serve = commands.add_parser(
        "serve", help="an OpenAI-compatible server (chat, completions, models, health, metrics) on the engine"
    )
    serve.add_argument("--model", default=default_model, help="bundled alias, hub id, local folder or .gguf file")
    serve.add_argument("--served-model-name", help="the model id clients see (default: --model)")
    serve.add_argument(
        "--method", type=_method, default="fides", help="default method of a request that names none (default fides)"
    )
    serve.add_argument("--config", help="a FidesConfig JSON file for fides (e.g. from calibration)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    serve.add_argument(
        "--max-new-tokens",
        type=_positive,
        default=128,
        help="tokens of a request that sets no max_tokens (default 128)",
    )
    serve.add_argument(
        "--max-queue",
        type=_positive,
        help="requests waiting for the engine (queued or being planned) beyond which a request gets 429 (default: "
        "no bound)",
    )
    serve.add_argument("--max-batch-size", type=_positive, help="requests decoding at once (default: no bound)")
    serve.add_argument(
        "--max-num-batched-tokens",
        type=_positive,
        help="tokens a step computes: its decodes, then prompt chunks of at most this (default 512 on CPU, 2048 on "
        "GPU)",
    )
    serve.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="compute every prompt in full (no reuse of shared prefixes' KV)",
    )
    serve.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=512,
        help="bound of the prefix cache in MiB; 0 turns it off (default 512)",
    )
    serve.add_argument(
        "--mode",
        choices=["exact", "fast"],
        help="exact: a greedy request's tokens do not depend on what else is in flight; fast: one attention call per "
        "layer over every row (default: exact on the CPU, fast elsewhere)",
    )
    serve.add_argument(
        "--compile",
        action="store_true",
        help="capture the decode step with torch.compile, one graph per batch bucket (CUDA graphs on CUDA; "
        "needs fast mode)",
    )
    serve.add_argument(
        "--warmup",
        action="store_true",
        help="with --compile: compile every batch bucket, with the hooks of --method and 'standard', before serving "
        "(a progress bar; the time is logged); a step that would recompile later runs eagerly, counted in /metrics",
    )
    serve.add_argument(
        "--kv-pool-tokens",
        type=_positive,
        help="fast mode's KV pool in positions, fixed; a request whose rows can never fit gets 400 "
        "(default: from the model's shape and the device's memory; refused in exact mode, which keeps no pool)",
    )
    serve.add_argument(
        "--buckets",
        type=_buckets,
        help="with --compile: row counts the captured step is compiled at (default: 1,2,4,8, then every 16 to 256)",
    )
    serve.add_argument(
        "--attention",
        choices=attention_choices(),
        default="auto",
        help="the decode step's attention backend: ragged (exact mode), gather or flex (fast mode); auto: ragged in "
        "exact mode, flex on CUDA, else gather (default: %(default)s)",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds the requests in flight get to finish on SIGTERM (default 30)",
    )
    serve.add_argument(
        "--api-key",
        help=f"require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_ENV}; unset: no key)",
    )
    serve.add_argument(
        "--allowed-hosts",
        nargs="+",
        metavar="HOST",
        help="Host headers answered ('*': any; default: 127.0.0.1, localhost and ::1 when bound to loopback, else any)",
    )
    serve.add_argument(
        "--cors-origins",
        nargs="+",
        metavar="ORIGIN",
        default=[],
        help="origins whose pages may call the server from a browser (default: none, CORS off)",
    )
    serve.add_argument(
        "--max-request-bytes",
        type=_positive,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help=f"largest request body; larger gets 413 (default {DEFAULT_MAX_REQUEST_BYTES})",
    )
    serve.add_argument(
        "--max-document-tokens",
        type=_positive,
        help="most tokens a request's documents may hold together; more gets 400 (default: the context window)",
    )
    serve.add_argument(
        "--trim-documents",
        action="store_true",
        help="trim documents that do not fit the context window, recorded as documents_trimmed (default: refuse "
        "with 400)",
    )
    add_model_arguments(serve)


def run_serve_command(args: argparse.Namespace) -> int:
    import uvicorn

    from fides_rag.decoder import FidesDecoder
    from fides_rag.method.config import FidesConfig
    from fides_rag.serve.access import AccessPolicy, is_loopback
    from fides_rag.serve.app import build_app
    from fides_rag.serve.limits import RequestLimits

    if args.warmup and not args.compile:
        raise ValueError("--warmup needs --compile: it compiles the captured decode step's buckets before serving")
    config = FidesConfig.from_file(args.config) if args.config else FidesConfig()
    engine = dict(prefix_caching=not args.no_prefix_caching, prefix_cache_bytes=args.prefix_cache_mb * 2**20)
    if args.max_num_batched_tokens is not None:
        engine["max_num_batched_tokens"] = args.max_num_batched_tokens
    engine |= {
        "mode": args.mode,
        "attention": args.attention,
        "compile": args.compile,
        "warmup": [args.method, "standard"] if args.warmup else False,
    }
    engine |= {"buckets": args.buckets} if args.buckets else {}
    if args.kv_pool_tokens is not None:
        engine["kv_pool_tokens"] = args.kv_pool_tokens
    decoder = FidesDecoder.from_pretrained(
        args.model, config=config, max_new_tokens=args.max_new_tokens, **engine, **load_options(args)
    )
    if args.max_batch_size is not None:
        decoder.configure(max_requests=args.max_batch_size)
    access = AccessPolicy.for_bind(
        args.host,
        api_key=args.api_key or os.environ.get(API_KEY_ENV),
        allowed_hosts=args.allowed_hosts,
        cors_origins=args.cors_origins,
    )
    if access.api_key is None and not is_loopback(args.host):
        logging.getLogger("fides_rag.serve").warning(
            "serving %s without an API key: anyone who reaches it can use it (--api-key or $%s)", args.host, API_KEY_ENV
        )
    limits = RequestLimits(
        max_request_bytes=args.max_request_bytes,
        max_document_tokens=args.max_document_tokens,
        trim_documents=args.trim_documents,
    )
    app = build_app(
        decoder,
        model_name=args.served_model_name or args.model,
        method=args.method,
        max_queue=args.max_queue,
        shutdown_timeout_s=args.shutdown_timeout,
        limits=limits,
        access=access,
    )
    # uvicorn re-raises the SIGTERM it handled once it has shut down; after a graceful shutdown the exit code is 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=args.shutdown_timeout)
    return 0
