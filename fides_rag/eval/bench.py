"""Latency, time split, context growth and throughput of the decoders, measured side by side in one process.

Per-step times come from a StoppingCriteria clock, which our decoder and transformers' `generate`
both call once per generated token, so every method is timed at the same point.
"""

from __future__ import annotations

import json
import platform
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from fides_rag.decoder import FidesDecoder, PromptPair
from fides_rag.eval.datasets import QAExample, load_nq_swap
from fides_rag.method.config import FidesConfig
from fides_rag.rules import get_method

PEER = "hf-cfg"
LATENCY_METHODS = ("standard", "cad", "adacad", "fides", PEER)


class StepClock(StoppingCriteria):
    """Records the time of every decoding step; never stops generation."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]  # transformers' BoolTensor


@dataclass
class Timing:
    """One timed generation: time to the first token (prefill + step 1) and mean time of the later steps."""

    first_token_s: float
    decode_s_per_token: float
    total_s: float
    tokens: int


def _summary(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles (the (n+1)p 'weibull' rule of statistics.quantiles, which earlier reports used), min, max,
    n."""
    data = np.asarray(values, dtype=float)
    q1, median, q3 = np.percentile(data, [25, 50, 75], method="weibull") if len(data) > 1 else [data[0]] * 3
    return {
        "median": float(median),
        "q1": float(q1),
        "q3": float(q3),
        "min": float(data.min()),
        "max": float(data.max()),
        "n": len(data),
    }


class Bench:
    """Runs the benchmark sections for one loaded decoder."""

    def __init__(self, decoder: FidesDecoder, examples: Sequence[QAExample]) -> None:
        self.decoder = decoder
        self.examples = list(examples)
        self.templated = decoder.prompts.use_chat_template
        self.raw = False
        """Time raw prompt pairs (`raw_prompts`) instead of the template's."""

    def prompts(self, example: QAExample, new_tokens: int) -> tuple[str, str]:
        prepared = self.decoder.prepare(example.question, list(example.contexts), new_tokens)
        return prepared.context_prompt, prepared.no_context_prompt

    @staticmethod
    def raw_prompts(example: QAExample) -> tuple[str, str]:
        """A raw prompt pair whose no-context prompt is much shorter (the question alone, about 20 tokens)."""
        question = f"Question: {example.question}\nAnswer:"
        return f"{' '.join(example.contexts)}\n{question}", question

    def time_ours(self, method: Any, context_prompt: str, no_context_prompt: str, new_tokens: int) -> Timing:
        clock = StepClock()
        start = time.perf_counter()
        result = self.decoder.generate(
            PromptPair(context_prompt, no_context_prompt, add_special_tokens=not self.templated or self.raw),
            method=method,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            stopping_criteria=StoppingCriteriaList([clock]),
        )
        return self._timing(start, clock, len(result.token_ids))

    def time_peer(
        self, context_prompt: str, no_context_prompt: str, new_tokens: int, guidance_scale: float = 2.0
    ) -> Timing:
        """transformers' classifier-free guidance: CAD on log-probs with a second, separate forward per step."""
        tok, model = self.decoder.tokenizer, self.decoder.model
        special = not self.templated or self.raw
        ids = tok(context_prompt, return_tensors="pt", add_special_tokens=special).to(model.device)
        negative = tok(no_context_prompt, return_tensors="pt", add_special_tokens=special).to(model.device)
        clock = StepClock()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(  # type: ignore[operator]  # a PreTrainedModel
                **ids,
                negative_prompt_ids=negative["input_ids"],
                negative_prompt_attention_mask=negative["attention_mask"],
                guidance_scale=guidance_scale,
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                stopping_criteria=StoppingCriteriaList([clock]),
                pad_token_id=tok.pad_token_id or 0,
            )
        return self._timing(start, clock, out.shape[1] - ids["input_ids"].shape[1])

    @staticmethod
    def _timing(start: float, clock: StepClock, tokens: int) -> Timing:
        first = clock.times[0] - start
        decode = (clock.times[-1] - clock.times[0]) / max(1, len(clock.times) - 1)
        return Timing(first, decode, clock.times[-1] - start, tokens)

    def _run(self, method: str, ctx: str, no_ctx: str, new_tokens: int) -> Timing:
        if method == PEER:
            return self.time_peer(ctx, no_ctx, new_tokens)
        return self.time_ours(method, ctx, no_ctx, new_tokens)

    # -- sections -------------------------------------------------------------------------------

    def latency(
        self, methods: Sequence[Any] = LATENCY_METHODS, samples: int = 20, warmup: int = 3, new_tokens: int = 64
    ) -> dict:
        """The source's protocol: batch 1, greedy, `new_tokens` forced, `warmup` discarded runs, paired prompts."""
        prompts = [
            self.raw_prompts(e) if self.raw else self.prompts(e, new_tokens) for e in self.examples[: samples + warmup]
        ]
        labels = [m if isinstance(m, str) else m[0] for m in methods]
        runs: dict[str, list[Timing]] = {label: [] for label in labels}
        for i, (ctx, no_ctx) in enumerate(prompts):
            for label, method in zip(labels, methods):  # interleaved, so drift hits every method alike
                timing = self._run(method if isinstance(method, str) else method[1], ctx, no_ctx, new_tokens)
                if i >= warmup:
                    runs[label].append(timing)
        return {
            label: {
                "decode_ms_per_token": _summary([t.decode_s_per_token * 1000 for t in timings]),
                "first_token_ms": _summary([t.first_token_s * 1000 for t in timings]),
                "total_ms_per_token": _summary([t.total_s / t.tokens * 1000 for t in timings]),
                "prompt_tokens": statistics.mean(
                    len(self.decoder.tokenizer(p[0])["input_ids"]) for p in prompts[warmup:]
                ),
            }
            for label, timings in runs.items()
        }

    def signal_split(self, samples: int = 8, warmup: int = 2, new_tokens: int = 32) -> dict:
        """Cost of FIDES's signals: FIDES against exact ablations that skip the lens (Noise) and the layer reads
        (Shift)."""
        config: Any = getattr(self.decoder.method, "config", None)
        variants = [
            ("cad", "cad"),
            ("fides-opposition-only", get_method("fides", config=config.with_signals("opposition"))),
            ("fides-no-noise", get_method("fides", config=config.without("noise"))),
            ("fides-no-shift", get_method("fides", config=config.without("shift"))),
            ("fides", get_method("fides", config=config)),
        ]
        return self.latency(variants, samples=samples, warmup=warmup, new_tokens=new_tokens)

    def context_growth(
        self, lengths: Sequence[int] = (256, 512, 1024, 2048), new_tokens: int = 16, repeats: int = 2
    ) -> dict:
        """Latency of standard and FIDES as the document block grows, with both prompts' lengths in tokens. (The
        KV-cache bytes are not measured here: the decoder exposes no cache's size, and measuring one would mean
        running the engine's prefill outside the engine; FIDES holds both paths' caches, its need the sum.)"""
        corpus = " ".join(c for e in self.examples for c in e.contexts)
        corpus_ids = self.decoder.tokenizer(corpus, add_special_tokens=False)["input_ids"]
        question = self.examples[0].question
        out: dict[str, Any] = {}
        for target in lengths:
            _, base_ids = self.decoder.prompts.render(question, "")
            doc = self.decoder.tokenizer.decode(corpus_ids[: max(1, target - len(base_ids))])
            prepared = self.decoder.prepare(question, [doc], new_tokens)
            row: dict[str, Any] = {
                "prompt_tokens": len(prepared.context_ids),
                "no_context_tokens": len(prepared.no_context_ids),
            }
            for method in ("standard", "fides"):
                timings = [
                    self.time_ours(method, prepared.context_prompt, prepared.no_context_prompt, new_tokens)
                    for _ in range(repeats)
                ]
                row[method] = {
                    "first_token_ms": statistics.median(t.first_token_s * 1000 for t in timings),
                    "decode_ms_per_token": statistics.median(t.decode_s_per_token * 1000 for t in timings),
                }
            out[str(target)] = row
        return out

    def throughput(
        self, batch_sizes: Sequence[int] = (1, 4, 8, 16), n_examples: int = 24, new_tokens: int = 16
    ) -> dict:
        """Examples per second of an evaluation run (real stops), per batch size, and four methods at once."""
        examples = sorted(
            self.examples[:n_examples], key=lambda e: len(" ".join(e.contexts))
        )  # length-bucketed batches
        questions = [e.question for e in examples]
        documents = [list(e.contexts) for e in examples]

        def rate(fn) -> float:
            start = time.perf_counter()
            fn()
            return len(examples) / (time.perf_counter() - start)

        out: dict[str, Any] = {"examples": len(examples), "fides_by_batch_size": {}}
        self.decoder.generate_batch(questions[:2], documents[:2], method="fides", max_new_tokens=4)  # warm-up
        for size in batch_sizes:
            out["fides_by_batch_size"][str(size)] = rate(
                lambda size=size: [
                    self.decoder.generate_batch(
                        questions[i : i + size], documents[i : i + size], method="fides", max_new_tokens=new_tokens
                    )
                    for i in range(0, len(examples), size)
                ]
            )
        size = 8
        singles = {}
        for method in ("standard", "cad", "adacad", "fides"):
            singles[method] = rate(
                lambda method=method: [
                    self.decoder.generate_batch(
                        questions[i : i + size], documents[i : i + size], method=method, max_new_tokens=new_tokens
                    )
                    for i in range(0, len(examples), size)
                ]
            )
        out["single_method_batch8"] = singles
        out["four_methods_shared_prefill_batch8"] = rate(
            lambda: [
                self.decoder.generate_batch(
                    questions[i : i + size],
                    documents[i : i + size],
                    methods=["standard", "cad", "adacad", "fides"],
                    max_new_tokens=new_tokens,
                )
                for i in range(0, len(examples), size)
            ]
        )
        return out


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_bench(
    models: Sequence[str],
    sections: Sequence[str] = ("latency", "split", "context", "throughput"),
    *,
    data: str | None = None,
    samples: int = 20,
    warmup: int = 3,
    new_tokens: int = 64,
    device: str = "auto",
    out: str | Path | None = None,
    serving: dict[str, Any] | None = None,
    budget: dict[str, Any] | None = None,
    mode: str | None = None,
    log=lambda message: print(message, flush=True),
) -> dict:
    """Run the chosen sections on each model; write JSON to `out` after every section (nothing is lost)."""
    from fides_rag.models.loading import load_model

    examples = load_nq_swap(data)
    report: dict[str, Any] = {
        "machine": machine(),
        "protocol": {"samples": samples, "warmup": warmup, "new_tokens": new_tokens, "mode": mode},
        "models": {},
    }
    for name in models:
        model, tokenizer = load_model(name, device=device)
        bench = Bench(FidesDecoder(model, tokenizer, config=FidesConfig(), mode=mode), examples)
        result: dict[str, Any] = {}
        report["models"][name] = result
        for section in sections:
            log(f"[{name}] {section} ...")
            if section == "latency":
                result["latency"] = bench.latency(samples=samples, warmup=warmup, new_tokens=new_tokens)
            elif section == "raw":
                bench.raw = True
                result["raw"] = bench.latency(
                    ("standard", "cad", "fides"), samples=samples, warmup=warmup, new_tokens=new_tokens
                )
                bench.raw = False
            elif section == "split":
                result["split"] = bench.signal_split()
            elif section == "context":
                result["context"] = bench.context_growth()
            elif section == "serving":
                from fides_rag.eval.serving import serving as run_serving

                result["serving"] = run_serving(bench.decoder, examples, log=log, **(serving or {}))
            elif section == "budget":
                from fides_rag.eval.budget_sweep import budget_sweep

                result["budget"] = budget_sweep(bench.decoder, examples, log=log, **(budget or {}))
            elif section == "throughput":
                result["throughput"] = bench.throughput()
            else:
                raise ValueError(
                    f"unknown bench section {section!r}; choose from latency, raw, split, context, throughput, "
                    "serving, budget"
                )
            report["machine"] = machine()
            if out:
                Path(out).parent.mkdir(parents=True, exist_ok=True)
                Path(out).write_text(json.dumps(report, indent=2) + "\n")
            log(format_section(name, section, result[section]))
    return report


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def format_section(model: str, section: str, data: dict) -> str:
    """Markdown tables for one section's results."""
    lines = [f"\n### {model}: {section}\n"]
    if section in ("latency", "raw", "split"):
        lines.append("| method | decode ms/token (median [q1, q3]) | first token ms | total ms/token |")
        lines.append("|---|---|---|---|")
        for label, d in data.items():
            dec = d["decode_ms_per_token"]
            lines.append(
                f"| {label} | {dec['median']:.1f} [{dec['q1']:.1f}, {dec['q3']:.1f}] | "
                f"{d['first_token_ms']['median']:.0f} | {d['total_ms_per_token']['median']:.1f} |"
            )
        med = {label: d["decode_ms_per_token"]["median"] for label, d in data.items()}
        tot = {label: d["total_ms_per_token"]["median"] for label, d in data.items()}
        if section == "latency":
            lines.append("")
            lines.append(
                f"Decode ratios: FIDES/standard {_ratio(med['fides'], med['standard'])}, FIDES/CAD "
                f"{_ratio(med['fides'], med['cad'])}, "
                f"CAD/peer {_ratio(med['cad'], med[PEER])}, peer/standard {_ratio(med[PEER], med['standard'])}. "
                f"End-to-end (prefill included): FIDES/standard {_ratio(tot['fides'], tot['standard'])}, "
                f"FIDES/CAD {_ratio(tot['fides'], tot['cad'])}, CAD/peer {_ratio(tot['cad'], tot[PEER])}."
            )
        elif section == "raw":
            lines.append("")
            lines.append(
                f"Raw prompts (no-context prompt the question alone): FIDES/CAD {_ratio(med['fides'], med['cad'])}, "
                f"FIDES/standard {_ratio(med['fides'], med['standard'])} per decoded token; end to end FIDES/CAD "
                f"{_ratio(tot['fides'], tot['cad'])}."
            )
        else:
            lines.append("")
            lines.append(
                f"FIDES step over CAD: {med['fides'] - med['cad']:+.2f} ms; of which Noise (lens) ≈ "
                f"{med['fides'] - med['fides-no-noise']:+.2f} ms, "
                f"Shift (layer reads) ≈ {med['fides'] - med['fides-no-shift']:+.2f} ms."
            )
    elif section == "serving":
        from fides_rag.eval.serving import format_serving

        lines.append(format_serving(data))
    elif section == "budget":
        from fides_rag.eval.budget_sweep import format_budget_sweep

        lines.append(format_budget_sweep(data))
    elif section == "context":
        lines.append(
            "| context tokens (no-context) | standard first-token ms | FIDES first-token ms | standard decode ms/tok | "
            "FIDES decode ms/tok |"
        )
        lines.append("|---|---|---|---|---|")
        for _, d in data.items():
            s, f = d["standard"], d["fides"]
            lines.append(
                f"| {d['prompt_tokens']} ({d['no_context_tokens']}) | {s['first_token_ms']:.0f} | "
                f"{f['first_token_ms']:.0f} | "
                f"{s['decode_ms_per_token']:.1f} | {f['decode_ms_per_token']:.1f} |"
            )
    elif section == "throughput":
        by = data["fides_by_batch_size"]
        lines.append("| FIDES batch size | examples/s |")
        lines.append("|---|---|")
        lines += [f"| {k} | {v:.2f} |" for k, v in by.items()]
        single = data["single_method_batch8"]
        four = data["four_methods_shared_prefill_batch8"]
        lines.append("")
        lines.append(
            f"Batch 8 / batch 1: {by.get('8', 0) / by['1']:.2f}x. Four methods with shared prefill: {four:.2f} ex/s; "
            + ", ".join(f"{m} alone {v:.2f} ex/s" for m, v in single.items())
            + f". Four-method cost = {single['fides'] / four:.2f}x FIDES alone, {single['standard'] / four:.2f}x "
            "standard alone, "
            f"running the four separately takes {sum(1 / v for v in single.values()) * four:.2f}x as long."
        )
    return "\n".join(lines)
