"""The `fides-rag serve` app as a Ray Serve deployment: replicas, autoscaling, and a cluster of many machines.

Each replica loads its own decoder and serves the same FastAPI app (`build_app`); Ray's HTTP proxy spreads requests
over the replicas. `serve run fides_rag.serve.ray_deployment:app_builder model=smollm2-135m-instruct` runs it.
"""

from __future__ import annotations

from typing import Any

from fides_rag.decoder import FidesDecoder
from fides_rag.extras import require

serve = require("ray.serve", "scale", purpose="the Ray Serve deployment")
AutoscalingConfig = serve.config.AutoscalingConfig


@serve.ingress()
class FidesReplica:
    """One replica: a decoder loaded in the replica's process and the OpenAI-compatible app around it."""

    def __init__(self, model: str, method: str = "fides", load_options: dict[str, Any] | None = None,
                 decoder_factory: Any = None) -> None:
        self.model_name, self.method = model, method
        factory = decoder_factory or (lambda: FidesDecoder.from_pretrained(model, **(load_options or {})))
        self.decoder = factory()

    def __serve_build_asgi_app__(self):
        from fides_rag.serve.app import build_app

        return build_app(self.decoder, model_name=self.model_name, method=self.method)


def deployment(model: str, *, method: str = "fides", load_options: dict[str, Any] | None = None,
               num_replicas: int | None = None, min_replicas: int = 1, max_replicas: int = 2,
               target_ongoing_requests: float = 8.0, num_cpus: float = 1.0, num_gpus: float = 0.0,
               upscale_delay_s: float | None = None, decoder_factory: Any = None):
    """A bound deployment: `num_replicas` fixed replicas, or autoscaling between `min_replicas` and `max_replicas`.

    `num_cpus`/`num_gpus` are reserved per replica (give a `device_map` replica every GPU it spreads over).
    `upscale_delay_s` overrides Ray's wait before adding a replica under load.
    `decoder_factory` (a picklable zero-argument callable returning a decoder) replaces loading `model` by name.
    """
    if num_replicas is not None and num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    if not 1 <= min_replicas <= max_replicas:
        raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {min_replicas} and {max_replicas}")
    delay = {} if upscale_delay_s is None else {"upscale_delay_s": upscale_delay_s}
    scaling: dict[str, Any] = (
        {"num_replicas": num_replicas} if num_replicas is not None else
        {"autoscaling_config": AutoscalingConfig(min_replicas=min_replicas, max_replicas=max_replicas,
                                                 target_ongoing_requests=target_ongoing_requests, **delay)})
    options = {"name": "fides", "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus},
               "max_ongoing_requests": max(64, int(target_ongoing_requests * 4)), **scaling}
    return serve.deployment(FidesReplica, **options).bind(model, method, load_options, decoder_factory)


def app_builder(args: dict[str, str]):
    """Entry point for `serve run fides_rag.serve.ray_deployment:app_builder model=NAME [method=..] [device_map=auto]
    [num_replicas=N | min_replicas=1 max_replicas=2] [num_cpus=1] [num_gpus=0]`."""
    known = {"model", "method", "device_map", "dtype", "device", "num_replicas", "min_replicas", "max_replicas",
             "num_cpus", "num_gpus", "target_ongoing_requests"}
    unknown = set(args) - known
    if unknown:
        raise ValueError(f"unknown serve run arguments {sorted(unknown)}; known: {sorted(known)}")
    if "model" not in args:
        raise ValueError("serve run needs model=NAME (a bundled alias, a local path or a hub id)")
    load = {k: args[k] for k in ("device_map", "dtype", "device") if k in args}
    return deployment(
        args["model"], method=args.get("method", "fides"), load_options=load,
        num_replicas=int(args["num_replicas"]) if "num_replicas" in args else None,
        min_replicas=int(args.get("min_replicas", 1)), max_replicas=int(args.get("max_replicas", 2)),
        num_cpus=float(args.get("num_cpus", 1)), num_gpus=float(args.get("num_gpus", 0)),
        target_ongoing_requests=float(args.get("target_ongoing_requests", 8)))
