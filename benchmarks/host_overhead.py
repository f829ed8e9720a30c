"""Host work per decode step: the engine's batch-1 step against a bare transformers loop, on a random-weight Llama so
small (1 layer, 64 wide) that a step is almost all host work.

Each configuration decodes one standard greedy request twice, to --short and to --long new tokens (both forced with
min_new_tokens); the time per step is the difference over the extra steps, so prefill, the request's set-up and its
result cancel out. The bare loop does the same with `model(...)` over a `DynamicCache`, an argmax and one `.item()` a
step (a real loop reads every token to test for its end). Configurations are interleaved within each repeat so drift
hits them alike; the median over --repeats is reported, with the ratio to the bare loop's.

    OMP_NUM_THREADS=1 python benchmarks/host_overhead.py --out results/host-overhead/cpu-1-thread.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

CONFIGS = ("exact", "fast", "fast-compiled")
"""Engine configurations: exact mode; fast mode (the pool, eager; the default on a GPU); fast mode with its decode
step captured by torch.compile's `eager` backend (graph capture without code generation, so no compiler is needed)."""


def tiny_model(vocab: int) -> Any:
    from fides_rag.testing import HOST_BOUND_LLAMA, build_tiny_model

    return build_tiny_model("llama", vocab, max_position_embeddings=4096, **HOST_BOUND_LLAMA)


def make_decoder(model: Any, tokenizer: Any, config: str) -> Any:
    from fides_rag import FidesDecoder, PromptTemplate

    options: dict[str, Any] = dict(prompt_template=PromptTemplate(stop=()), prefix_caching=False)
    if config == "exact":
        return FidesDecoder(model, tokenizer, mode="exact", **options)
    if config == "fast":
        return FidesDecoder(model, tokenizer, mode="fast", kv_pool_tokens=4096, **options)
    if config == "fast-compiled":
        return FidesDecoder(
            model, tokenizer, mode="fast", kv_pool_tokens=4096, compile="eager", buckets=(1,), **options
        )
    raise ValueError(f"unknown configuration {config!r}; known: {', '.join(CONFIGS)}")


def engine_seconds(decoder: Any, question: str, document: str, steps: int) -> float:
    start = time.perf_counter()
    result = decoder.generate(question, [document], method="standard", max_new_tokens=steps, min_new_tokens=steps)
    elapsed = time.perf_counter() - start
    if len(result.token_ids) != steps:
        raise RuntimeError(f"asked for {steps} tokens, got {len(result.token_ids)}")
    return elapsed


def bare_seconds(model: Any, ids: Any, steps: int) -> float:
    import torch
    from transformers import DynamicCache

    start = time.perf_counter()
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        token.item()
        for _ in range(steps - 1):
            out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            token.item()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--short", type=int, default=8, help="new tokens of the short decode")
    parser.add_argument("--long", type=int, default=264, help="new tokens of the long decode")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="results JSON (printed either way)")
    args = parser.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if args.long <= args.short:
        parser.error("--long must exceed --short")

    import torch

    from fides_rag.testing import build_tokenizer

    tokenizer = build_tokenizer()
    model = tiny_model(len(tokenizer))
    question = "Where is the red box stored?"
    document = "The red box is stored in the attic, beside the old lamp and the winter coats."
    decoders = {config: make_decoder(model, tokenizer, config) for config in configs}
    context_ids = list(decoders[configs[0]].prepare(question, [document], args.long).context_ids)
    ids = torch.tensor([context_ids])
    extra = args.long - args.short

    def per_step(run: Any) -> float:
        return (run(args.long) - run(args.short)) / extra * 1000

    runners: dict[str, Any] = {"bare": lambda n: bare_seconds(model, ids, n)}
    for config, decoder in decoders.items():
        runners[config] = lambda n, d=decoder: engine_seconds(d, question, document, n)
    for run in runners.values():  # warm-up: first-call costs, and the captured step's compilation
        per_step(run)
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.repeats):
        for name, run in runners.items():
            samples[name].append(per_step(run))
    bare = statistics.median(samples["bare"])
    report = {
        "model": "random-weight Llama, 1 layer, hidden 64, 4 heads (2 KV heads), float32",
        "prompt_tokens": len(context_ids),
        "steps_timed": extra,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "ms_per_step": {name: round(statistics.median(s), 4) for name, s in samples.items()},
        "ms_per_step_samples": {name: [round(v, 4) for v in s] for name, s in samples.items()},
        "ratio_to_bare": {name: round(statistics.median(s) / bare, 3) for name, s in samples.items()},
    }
    report["captured_fallback_steps"] = {c: d.stats.captured_fallback_steps for c, d in decoders.items()}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
