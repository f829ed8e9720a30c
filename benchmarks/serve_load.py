"""Bounded load test of an OpenAI-compatible FIDES server: concurrency levels, TTFT, latency, equality with sequential.

Starts `fides-rag serve` itself (or uses `--url`), builds a fixed set of greedy chat requests from NQ-Swap rows
(question as the user turn, the passage as `documents`, max_tokens spread over 8..64, every other request streamed),
sends them one at a time first (the reference), then at each concurrency level. Every concurrent text must equal its
sequential text; each request carries its own index so a lost or swapped response is counted. Loopback only.

    python benchmarks/serve_load.py --model smollm2-135m-instruct --port 8210 --requests 64 --levels 8,32,64 \\
        --out results/serve-load/smollm2-135m-instruct-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import quantiles
from urllib.parse import urlparse

import httpx

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class Outcome:
    """What one request came back with."""

    index: int
    stream: bool
    text: str = ""
    error: str = ""
    latency_s: float = 0.0
    ttft_s: float | None = None
    completion_tokens: int = 0
    ids: list[str] = field(default_factory=list)


def build_requests(count: int, seed: int, data: str | None, max_tokens: int | None = None) -> list[dict]:
    """`count` greedy chat bodies from NQ-Swap rows (conflict form), lengths 8..64 (or all `max_tokens`), half
    streamed."""
    from fides_rag.eval.datasets import load_nq_swap

    examples = load_nq_swap(data, form="conflict", limit=count)
    if len(examples) < count:
        raise SystemExit(f"only {len(examples)} NQ-Swap rows, asked for {count} requests")
    rng = random.Random(seed)
    bodies = []
    for index, example in enumerate(examples):
        body = {
            "model": "",
            "messages": [{"role": "user", "content": example.question}],
            "documents": list(example.contexts),
            "max_tokens": rng.randint(8, 64),
            "temperature": 0.0,
            "stream": index % 2 == 0,
        }
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if body["stream"]:
            body["stream_options"] = {"include_usage": True}  # the last chunk carries the token count
        bodies.append(body)
    return bodies


async def send(client: httpx.AsyncClient, index: int, body: dict) -> Outcome:
    """One request; streaming requests record the time to the first chunk with content."""
    out = Outcome(index, bool(body["stream"]))
    start = time.perf_counter()
    try:
        if body["stream"]:
            parts = []
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code != 200:
                    out.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                    return out
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    chunk = json.loads(payload)
                    if chunk.get("id") and chunk["id"] not in out.ids:
                        out.ids.append(chunk["id"])
                    for choice in chunk.get("choices", []):
                        piece = (choice.get("delta") or {}).get("content") or ""
                        if piece and out.ttft_s is None:
                            out.ttft_s = time.perf_counter() - start
                        parts.append(piece)
                    if chunk.get("usage"):
                        out.completion_tokens = chunk["usage"].get("completion_tokens", 0)
            out.text = "".join(parts)
        else:
            response = await client.post("/v1/chat/completions", json=body)
            if response.status_code != 200:
                out.error = f"HTTP {response.status_code}: {response.text[:200]}"
                return out
            data = response.json()
            out.ids = [data.get("id", "")]
            out.text = data["choices"][0]["message"]["content"] or ""
            out.completion_tokens = (data.get("usage") or {}).get("completion_tokens", 0)
    except Exception as exc:  # a failed request is counted, never fatal to the run
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        out.latency_s = time.perf_counter() - start
    return out


async def run_level(url: str, bodies: list[dict], concurrency: int, timeout_s: float) -> tuple[list[Outcome], float]:
    """Send every body with at most `concurrency` in flight; returns the outcomes in request order and the wall time."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:

        async def one(index: int, body: dict) -> Outcome:
            async with gate:
                return await send(client, index, body)

        start = time.perf_counter()
        tasks = [asyncio.create_task(one(i, b)) for i, b in enumerate(bodies)]
        done = await asyncio.wait_for(asyncio.gather(*tasks), timeout=timeout_s)
        return list(done), time.perf_counter() - start


def pct(values: list[float], q: int) -> float | None:
    """q-th percentile (inclusive method); None with no values."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return quantiles(values, n=100, method="inclusive")[q - 1]


def summarise(level: int, outcomes: list[Outcome], wall_s: float, reference: list[Outcome] | None) -> dict:
    """Throughput, TTFT and latency percentiles, errors, and equality with the sequential texts."""
    ok = [o for o in outcomes if not o.error]
    ttfts = [o.ttft_s for o in ok if o.stream and o.ttft_s is not None]
    latencies = [o.latency_s for o in ok]
    tokens = sum(o.completion_tokens for o in ok)
    counted = sum(1 for o in ok if o.completion_tokens)
    row = {
        "concurrency": level,
        "requests": len(outcomes),
        "errors": len(outcomes) - len(ok),
        "wall_s": round(wall_s, 3),
        "requests_per_s": round(len(ok) / wall_s, 3),
        "completion_tokens_per_s": round(tokens / wall_s, 2),
        "requests_with_usage": counted,
        "ttft_p50_s": pct(ttfts, 50),
        "ttft_p95_s": pct(ttfts, 95),
        "latency_p50_s": pct(latencies, 50),
        "latency_p95_s": pct(latencies, 95),
        "error_samples": sorted({o.error for o in outcomes if o.error})[:5],
    }
    indices = [o.index for o in outcomes]
    row["lost"] = len(set(range(len(outcomes))) - set(indices))
    all_ids = [i for o in ok for i in o.ids]
    row["duplicate_response_ids"] = len(all_ids) - len(set(all_ids))
    if reference is not None:
        mismatched = [o.index for o in ok if reference[o.index].error or o.text != reference[o.index].text]
        row["equal_to_sequential"] = len(ok) - len(mismatched)
        row["mismatched_indices"] = mismatched
    for key in ("ttft_p50_s", "ttft_p95_s", "latency_p50_s", "latency_p95_s"):
        row[key] = None if row[key] is None else round(row[key], 3)
    return row


def start_server(args: argparse.Namespace) -> subprocess.Popen:
    """`fides-rag serve` on loopback; returns once /health answers (or exits with the server's log)."""
    command = [
        sys.executable,
        "-m",
        "fides_rag.cli.main",
        "serve",
        "--model",
        args.model,
        "--method",
        args.method,
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        *args.server_arg,
    ]
    print("$ " + " ".join(command), flush=True)
    log = open(args.server_log, "w")  # noqa: SIM115 - the server writes it for its whole life
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + args.startup_timeout
    url = f"http://127.0.0.1:{args.port}"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}; see {args.server_log}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_server(process)
    raise SystemExit(f"server did not answer /health within {args.startup_timeout}s; see {args.server_log}")


def stop_server(process: subprocess.Popen) -> None:
    """SIGTERM (graceful), then SIGKILL after 30 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def markdown(rows: list[dict]) -> str:
    """The results as a markdown table."""

    def f(value) -> str:
        return "–" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    lines = [
        "| clients | requests | errors | req/s | tokens/s | TTFT p50 / p95 (s) | latency p50 / p95 (s) | equal to "
        "sequential |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        equal = f"{r['equal_to_sequential']}/{r['requests']}" if "equal_to_sequential" in r else "–"
        lines.append(
            f"| {r['concurrency']} | {r['requests']} | {r['errors']} | {f(r['requests_per_s'])} | "
            f"{f(r['completion_tokens_per_s'])} | {f(r['ttft_p50_s'])} / {f(r['ttft_p95_s'])} | "
            f"{f(r['latency_p50_s'])} / {f(r['latency_p95_s'])} | {equal} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an already running server (loopback only); otherwise one is started")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--method", default="fides")
    parser.add_argument("--port", type=int, default=8210)
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra argument for `fides-rag serve` (repeat)"
    )
    parser.add_argument("--server-log", default="serve-load-server.log")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--requests", type=int, default=64, help="requests per level (the same set at every level)")
    parser.add_argument("--levels", default="8,32,64", help="comma-separated concurrency levels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-tokens",
        type=int,
        help="every request's max_tokens (default: spread over 8..64); 1 measures "
        "prefill alone: the time a burst needs before its first tokens, whatever the scheduling",
    )
    parser.add_argument("--data", help="NQ-Swap parquet/jsonl (default: the shared data folder)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed for one level (and one request)")
    parser.add_argument("--no-sequential", action="store_true", help="skip the sequential reference pass")
    parser.add_argument("--out", type=Path, default=Path("runs/serve-load/results.json"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    if args.url and urlparse(args.url).hostname not in LOOPBACK:
        raise SystemExit(f"--url must be a loopback address, got {args.url}")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise SystemExit(f"--max-tokens must be at least 1, got {args.max_tokens}")
    bodies = build_requests(args.requests, args.seed, args.data, args.max_tokens)
    process = None if args.url else start_server(args)
    url = args.url or f"http://127.0.0.1:{args.port}"
    try:
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        for body in bodies:
            body["model"] = model
        rows, reference, timed_out = [], None, None
        for level in ([] if args.no_sequential else [1]) + levels:
            try:
                outcomes, wall = asyncio.run(run_level(url, bodies, level, args.timeout))
            except TimeoutError:
                timed_out = level
                break
            rows.append(summarise(level, outcomes, wall, reference))
            if level == 1 and reference is None and not args.no_sequential:
                reference = outcomes
            print(markdown(rows[-1:]) if len(rows) == 1 else markdown(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        if process is not None:
            stop_server(process)
    result = {
        "model": model,
        "method": args.method,
        "url": url,
        "requests_per_level": args.requests,
        "levels": levels,
        "seed": args.seed,
        "max_tokens_range": [8, 64] if args.max_tokens is None else [args.max_tokens] * 2,
        "stream_share": 0.5,
        "temperature": 0.0,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        },
        "command": " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]),
        "rows": rows,
        "sequential_texts": [o.text for o in reference] if reference else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(rows) + "\n")
    print(markdown(rows))
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    if timed_out is not None:
        print(
            "serve_load: the "
            f"{'sequential pass' if timed_out == 1 and not args.no_sequential else f'{timed_out}-client level'} "
            f"did not finish within --timeout {args.timeout:g} s; the levels before it are written above. "
            "Rerun with a larger --timeout (or fewer --requests).",
            file=sys.stderr,
        )
        return 1
    failed = any(r["errors"] or r["lost"] or r.get("mismatched_indices") for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
