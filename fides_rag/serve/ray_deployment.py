"""The `fides-rag serve` app as a Ray Serve deployment: replicas, autoscaling, and a cluster of many machines.

Each replica loads its own decoder and serves the same FastAPI app (`build_app`); Ray's HTTP proxy spreads requests
over the replicas. `serve run fides_rag.serve.ray_deployment:app_builder model=smollm2-135m-instruct` runs it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fides_rag.decoder import FidesDecoder
from fides_rag.extras import require
from fides_rag.serve.defaults import API_KEY_ENV, DEFAULT_MAX_REQUEST_BYTES

serve = require("ray.serve", "scale", purpose="the Ray Serve deployment")
AutoscalingConfig = serve.config.AutoscalingConfig


@serve.ingress()
class FidesReplica:
    """One replica: a decoder loaded in the replica's process and the OpenAI-compatible app around it."""

    def __init__(
        self,
        model: str,
        method: str = "fides",
        load_options: dict[str, Any] | None = None,
        decoder_factory: Callable[[], FidesDecoder] | None = None,
        serving: dict[str, Any] | None = None,
    ) -> None:
        self.model_name, self.method, self.serving = model, method, dict(serving or {})
        factory = decoder_factory or (lambda: FidesDecoder.from_pretrained(model, **(load_options or {})))
        self.decoder = factory()

    def __serve_build_asgi_app__(self):
        return replica_app(self.decoder, self.model_name, self.method, self.serving)


def replica_app(decoder: FidesDecoder, model_name: str, method: str, serving: dict[str, Any]):
    """A replica's FastAPI app with `serving`'s access and limits (see `deployment`)."""
    from fides_rag.serve.access import AccessPolicy
    from fides_rag.serve.app import build_app
    from fides_rag.serve.limits import RequestLimits

    access = AccessPolicy.for_bind(
        "0.0.0.0",
        api_key=serving.get("api_key"),
        allowed_hosts=serving.get("allowed_hosts"),
        cors_origins=serving.get("cors_origins", ()),
    )
    limits = RequestLimits(
        max_request_bytes=serving.get("max_request_bytes", DEFAULT_MAX_REQUEST_BYTES),
        max_document_tokens=serving.get("max_document_tokens"),
        trim_documents=serving.get("trim_documents", False),
    )
    return build_app(decoder, model_name=model_name, method=method, limits=limits, access=access)


def deployment(
    model: str,
    *,
    method: str = "fides",
    load_options: dict[str, Any] | None = None,
    num_replicas: int | None = None,
    min_replicas: int = 1,
    max_replicas: int = 2,
    target_ongoing_requests: float = 8.0,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    upscale_delay_s: float | None = None,
    decoder_factory: Callable[[], FidesDecoder] | None = None,
    serving: dict[str, Any] | None = None,
):
    """A bound deployment: `num_replicas` fixed replicas, or autoscaling between `min_replicas` and `max_replicas`.

    `num_cpus`/`num_gpus` are reserved per replica (give a `device_map` replica every GPU it spreads over).
    `upscale_delay_s` overrides Ray's wait before adding a replica under load.
    `decoder_factory` (a picklable zero-argument callable returning a decoder) replaces loading `model` by name.
    `serving`: the app's access and limits, as `fides-rag serve`'s flags: api_key, allowed_hosts (default any: the
    replicas sit behind Ray's proxy), cors_origins, max_request_bytes, max_document_tokens, trim_documents.
    """
    if num_replicas is not None and num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    if not 1 <= min_replicas <= max_replicas:
        raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {min_replicas} and {max_replicas}")
    delay = {} if upscale_delay_s is None else {"upscale_delay_s": upscale_delay_s}
    scaling: dict[str, Any] = (
        {"num_replicas": num_replicas}
        if num_replicas is not None
        else {
            "autoscaling_config": AutoscalingConfig(
                min_replicas=min_replicas,
                max_replicas=max_replicas,
                target_ongoing_requests=target_ongoing_requests,
                **delay,
            )
        }
    )
    options = {
        "name": "fides",
        "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus},
        "max_ongoing_requests": max(64, int(target_ongoing_requests * 4)),
        **scaling,
    }
    return serve.deployment(FidesReplica, **options).bind(model, method, load_options, decoder_factory, serving)


def app_builder(args: dict[str, str]):
    """Entry point for `serve run fides_rag.serve.ray_deployment:app_builder model=NAME [method=..] [device_map=auto]
    [num_replicas=N | min_replicas=1 max_replicas=2] [num_cpus=1] [num_gpus=0] [api_key=KEY] [allowed_hosts=a,b]
    [cors_origins=https://a,https://b] [max_request_bytes=N] [max_document_tokens=N] [trim_documents=true]`; the API key
    defaults to $FIDES_RAG_API_KEY."""
    known = {
        "model",
        "method",
        "device_map",
        "dtype",
        "device",
        "num_replicas",
        "min_replicas",
        "max_replicas",
        "num_cpus",
        "num_gpus",
        "target_ongoing_requests",
        *SERVING_ARGUMENTS,
    }
    unknown = set(args) - known
    if unknown:
        raise ValueError(f"unknown serve run arguments {sorted(unknown)}; known: {sorted(known)}")
    if "model" not in args:
        raise ValueError("serve run needs model=NAME (a bundled alias, a local path or a hub id)")
    load: dict[str, Any] = {k: args[k] for k in ("device_map", "dtype", "device") if k in args}
    return deployment(
        args["model"],
        method=args.get("method", "fides"),
        load_options=load,
        num_replicas=int(args["num_replicas"]) if "num_replicas" in args else None,
        min_replicas=int(args.get("min_replicas", 1)),
        max_replicas=int(args.get("max_replicas", 2)),
        num_cpus=float(args.get("num_cpus", 1)),
        num_gpus=float(args.get("num_gpus", 0)),
        target_ongoing_requests=float(args.get("target_ongoing_requests", 8)),
        serving=serving_options(args),
    )


SERVING_ARGUMENTS = (
    "api_key",
    "allowed_hosts",
    "cors_origins",
    "max_request_bytes",
    "max_document_tokens",
    "trim_documents",
)


def serving_options(args: dict[str, str]) -> dict[str, Any]:
    """The app's access and limits from `serve run` arguments (lists comma-separated; the key from the environment
    when not given)."""
    options: dict[str, Any] = {"api_key": args.get("api_key") or os.environ.get(API_KEY_ENV)}
    for name in ("allowed_hosts", "cors_origins"):
        if name in args:
            options[name] = [item.strip() for item in args[name].split(",") if item.strip()]
    for name in ("max_request_bytes", "max_document_tokens"):
        if name in args:
            options[name] = int(args[name])
    if "trim_documents" in args:
        if args["trim_documents"].lower() not in ("true", "false"):
            raise ValueError(f"trim_documents must be true or false, got {args['trim_documents']!r}")
        options["trim_documents"] = args["trim_documents"].lower() == "true"
    return options
