"""Prometheus metrics of one server (its own registry): requests, tokens, queue length, rows in flight, latency."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fides_rag.decoder import FidesDecoder

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300)


class ServerMetrics:
    """The counters, gauges and histograms that `GET /metrics` exposes in Prometheus text format."""

    def __init__(self, decoder: FidesDecoder) -> None:
        """The gauges read `decoder.stats` when scraped."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "fides_requests", "Requests answered, by endpoint and HTTP status", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter("fides_prompt_tokens", "Prompt tokens of the context path", registry=r)
        self.completion_tokens = Counter("fides_completion_tokens", "Tokens generated", registry=r)
        self.latency = Histogram(
            "fides_request_latency_seconds",
            "Time from arrival to the last token",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "fides_time_to_first_token_seconds",
            "Time from arrival to the first token",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        gauges = (
            ("fides_queue_length", "Requests waiting for the engine", "queue_length"),
            ("fides_requests_in_flight", "Requests decoding", "requests_in_flight"),
            ("fides_rows_in_flight", "Rows (paths) decoding", "rows_in_flight"),
            ("fides_prefix_cache_hits", "Prompt rows whose prefill started from a cached prefix", "prefix_cache_hits"),
            (
                "fides_prefix_cache_hit_tokens",
                "Prompt tokens taken from the prefix cache instead of computed",
                "prefix_cache_hit_tokens",
            ),
            ("fides_prefix_cache_misses", "Prompt rows that found no cached prefix", "prefix_cache_misses"),
            ("fides_prefix_cache_bytes", "Bytes of KV states the prefix cache holds", "prefix_cache_bytes"),
            ("fides_prompt_tokens_prefilled", "Prompt tokens of every path, prefilled in chunks", "prompt_tokens"),
            ("fides_kv_pool_tokens", "Positions fast mode's KV pool holds (fixed; 0 in exact mode)", "kv_pool_tokens"),
            (
                "fides_kv_pool_used_tokens",
                "Positions of the KV pool's blocks that running rows hold",
                "kv_pool_used_tokens",
            ),
            (
                "fides_kv_pool_shared_tokens",
                "Positions of KV pool blocks rows took by reference instead of a copy",
                "kv_pool_shared_tokens",
            ),
            (
                "fides_prompt_tokens_computed",
                "Of those, tokens computed (the rest came from the prefix cache)",
                "prefill_tokens",
            ),
            (
                "fides_captured_fallback_steps",
                "Decode steps of a captured bucket that ran eagerly (compile failed or would recompile)",
                "captured_fallback_steps",
            ),
        )
        for name, description, field in gauges:
            Gauge(name, description, registry=r).set_function(lambda field=field: getattr(decoder.stats, field))  # type: ignore[misc]  # field bound by default

    def text(self) -> bytes:
        return generate_latest(self.registry)
