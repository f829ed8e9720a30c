"""Fast mode's KV pool with prompt blocks shared by reference, against the same decoder without the prefix cache
(every row's prompt copied into blocks of its own), on a real backbone (CPU).

`--requests` FIDES requests over the same document, each with its own question, are submitted at once (a RAG
service answering many users over one retrieved document), then once more (a second wave, after the first's rows
left, whose prompts find the first wave's kept blocks). For each decoder it records, at every engine step
(`FidesDecoder.around_steps`), the positions of the pool's blocks the rows hold (`kv_pool_used_tokens`, a shared
block counted once), and reports the peak; the blocks taken by reference and copied on write; the bytes of prompt
states not copied into the pool; and whether each request's tokens equal the unshared decoder's.

    python benchmarks/pool_sharing.py --out results/pool-sharing/smollm2-135m-cpu.json
    python benchmarks/pool_sharing.py --table results/pool-sharing/smollm2-135m-cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import fides_rag
from fides_rag import FidesDecoder

DOCUMENT = (
    "The Millau Viaduct is a cable-stayed bridge that spans the gorge valley of the Tarn near Millau in southern "
    "France. Designed by the structural engineer Michel Virlogeux and the architect Norman Foster, it was formally "
    "inaugurated on 14 December 2004 and opened to traffic two days later. One of its masts rises 343 metres above "
    "the base of the structure, and the deck is 2,460 metres long. "
)
QUESTIONS = (
    "Who designed the Millau Viaduct?",
    "How long is the deck of the viaduct?",
    "When was the viaduct inaugurated?",
    "Which river does the viaduct span?",
    "How tall is the highest mast?",
    "Near which town is the viaduct?",
    "Who was the architect of the viaduct?",
    "When did the viaduct open to traffic?",
)


class PoolUse:
    """The most pool positions rows held at the end of an engine step with all `requests` requests decoding (the
    decoders are compared at the same occupancy, whatever their prefill speed)."""

    def __init__(self, decoder: FidesDecoder, requests: int) -> None:
        self.decoder, self.requests, self.peak, self.steps = decoder, requests, 0, 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        yield
        stats = self.decoder.stats
        if stats.requests_in_flight == self.requests and stats.queue_length == 0:
            self.steps += 1
            self.peak = max(self.peak, stats.kv_pool_used_tokens)


def wave(decoder: FidesDecoder, requests: int, new_tokens: int, repeats: int) -> tuple[list[list[int]], int | None]:
    """`requests` FIDES requests at once; their tokens, and the peak pool positions held with all of them decoding
    (None: the pool never held them all at once)."""
    use = PoolUse(decoder, requests)
    with decoder.around_steps(use):
        handles = [
            decoder.submit(
                f"{QUESTIONS[i % len(QUESTIONS)]} ({i})",
                [DOCUMENT * repeats],
                method="fides",
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
            )
            for i in range(requests)
        ]
        tokens = [h.result().token_ids for h in handles]
    return tokens, use.peak if use.steps else None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.tiny:  # a tiny random Llama: the script's own check
        from fides_rag.testing import build_tiny_model, build_tokenizer

        tokenizer = build_tokenizer()
        model = build_tiny_model("llama", len(tokenizer), max_position_embeddings=4096)
    else:
        model, tokenizer = fides_rag.load_model(args.backbone, dtype=torch.float32)
    config = model.config
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_position = 2 * config.num_hidden_layers * kv_heads * head_dim * 4  # keys and values, float32
    report: dict[str, Any] = {
        "backbone": "tiny-llama" if args.tiny else args.backbone,
        "dtype": "float32",
        "device": "cpu",
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "fides_rag": fides_rag.__version__,
        "requests": args.requests,
        "new_tokens": args.new_tokens,
        "document_repeats": args.repeats,
        "kv_pool_tokens": args.kv_pool_tokens,
        "document_tokens": len(tokenizer(DOCUMENT * args.repeats).input_ids),
        "decoders": {},
    }
    tokens: dict[str, list[list[int]]] = {}
    for label, caching in (("shared", True), ("copied", False)):
        if label not in args.decoders:
            continue
        decoder = FidesDecoder(
            model, tokenizer, mode="fast", kv_pool_tokens=args.kv_pool_tokens, prefix_caching=caching
        )
        start = time.perf_counter()
        largest = []
        first, first_peak = wave(decoder, args.requests, args.new_tokens, args.repeats)
        largest.append(decoder.stats.largest_batch)
        second, second_peak = wave(decoder, args.requests, args.new_tokens, args.repeats)
        largest.append(decoder.stats.largest_batch)
        stats = decoder.stats
        tokens[label] = first + second
        report["decoders"][label] = {
            "prefix_caching": caching,
            "peak_used_tokens_first_wave": first_peak,
            "peak_used_tokens_second_wave": second_peak,
            "most_requests_decoding_together": largest[-1],
            "shared_tokens": stats.kv_pool_shared_tokens,
            "copied_on_write": stats.kv_pool_copied_on_write,
            "kept_tokens_after": stats.kv_pool_kept_tokens,
            "prompt_bytes_not_copied": stats.kv_pool_shared_tokens * per_position,
            "prompt_tokens": stats.prompt_tokens,
            "prefill_tokens": stats.prefill_tokens,
            "failed": stats.failed,
            "seconds": time.perf_counter() - start,
        }
        print(label, json.dumps(report["decoders"][label]), flush=True)
    if set(tokens) != {"shared", "copied"}:
        return report
    equal = sum(a == b for a, b in zip(tokens["shared"], tokens["copied"]))
    report["requests_with_equal_tokens"] = f"{equal} / {len(tokens['shared'])}"
    shared, copied = report["decoders"]["shared"], report["decoders"]["copied"]
    for wave_name in ("first_wave", "second_wave"):
        key = f"peak_used_tokens_{wave_name}"
        both = shared[key] is not None and copied[key]
        report[f"peak_ratio_{wave_name}"] = shared[key] / copied[key] if both else None
    return report


def table(report: dict[str, Any]) -> str:
    rows = [
        "| decoder | most requests decoding together | peak pool positions held, wave 1 | wave 2 | "
        "positions taken by reference | copied on write | prompt bytes not copied | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    count = lambda v: "-" if v is None else f"{v:,}"  # noqa: E731  # None: never all decoding at once
    for label, d in report["decoders"].items():
        rows.append(
            f"| {label} | {d.get('most_requests_decoding_together', '-')} | "
            f"{count(d['peak_used_tokens_first_wave'])} | {count(d['peak_used_tokens_second_wave'])} | "
            f"{d['shared_tokens']:,} | {d['copied_on_write']} | {d['prompt_bytes_not_copied'] / 2**20:.1f} MiB | "
            f"{d['failed']} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=6, help="the document repeated this many times (~500 tokens)")
    parser.add_argument("--kv-pool-tokens", type=int, default=65536)
    parser.add_argument("--tiny", action="store_true", help="a tiny random Llama instead of the backbone")
    parser.add_argument(
        "--decoders",
        type=lambda v: v.split(","),
        default=["shared", "copied"],
        help="which decoders to run: shared (prefix cache on), copied (off); default both",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path, help="print the table of a results file and exit")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    report = measure(args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(f"equal tokens: {report.get('requests_with_equal_tokens', '-')}")


if __name__ == "__main__":
    main()
