"""Prometheus metrics of one server (its own registry): requests, tokens, queue length, rows in flight, latency."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from typing import Any

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300)


class ServerMetrics:
    """The counters, gauges and histograms that `GET /metrics` exposes in Prometheus text format."""

    def __init__(self, engine: Any) -> None:
        """`engine`: anything with queue_length, requests_in_flight and rows_in_flight (a FidesDecoder)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("fides_requests", "Requests answered, by endpoint and HTTP status", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("fides_prompt_tokens", "Prompt tokens of the context path", registry=r)
        self.completion_tokens = Counter("fides_completion_tokens", "Tokens generated", registry=r)
        self.latency = Histogram("fides_request_latency_seconds", "Time from arrival to the last token", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("fides_time_to_first_token_seconds", "Time from arrival to the first token", ["endpoint"],
                              buckets=LATENCY_BUCKETS, registry=r)
        Gauge("fides_queue_length", "Requests waiting for the engine", registry=r).set_function(lambda: engine.queue_length)
        Gauge("fides_requests_in_flight", "Requests decoding", registry=r).set_function(lambda: engine.requests_in_flight)
        Gauge("fides_rows_in_flight", "Rows (paths) decoding", registry=r).set_function(lambda: engine.rows_in_flight)
        core = getattr(engine, "engine", engine)  # a FidesDecoder's DecodeEngine: its prefix cache and prefill counts
        prefixes = core.prefix_cache
        Gauge("fides_prefix_cache_hits", "Prompt rows whose prefill started from a cached prefix", registry=r).set_function(lambda: prefixes.stats.hits)
        Gauge("fides_prefix_cache_hit_tokens", "Prompt tokens taken from the prefix cache instead of computed", registry=r).set_function(lambda: prefixes.stats.hit_tokens)
        Gauge("fides_prefix_cache_misses", "Prompt rows that found no cached prefix", registry=r).set_function(lambda: prefixes.stats.misses)
        Gauge("fides_prefix_cache_bytes", "Bytes of KV states the prefix cache holds", registry=r).set_function(lambda: prefixes.bytes)
        Gauge("fides_prompt_tokens_prefilled", "Prompt tokens of every path, prefilled in chunks", registry=r).set_function(lambda: core.stats.prompt_tokens)
        Gauge("fides_prompt_tokens_computed", "Of those, tokens computed (the rest came from the prefix cache)", registry=r).set_function(lambda: core.stats.prefill_tokens)

    def text(self) -> bytes:
        return generate_latest(self.registry)
