"""Questions per second of the closed-book lane: batches of 8 that wait for their slowest answer (the lane as it was)
against the engine kept full (`closed_book_answers`, up to `--in-flight` questions submitted at once), on the same
questions in the same mode, with the answers compared one by one. With `--fast-sample N`, the first N questions are
also answered in fast mode and compared with exact mode's answers.

    python benchmarks/closed_book_lane.py --backbone qwen2.5-coder-1.5b --questions 64 \\
        --out results/closed-book-lane/qwen2.5-coder-1.5b.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from fides_rag.decoder import FidesDecoder
from fides_rag.eval.closed_book import closed_book_answers, closed_book_settings, distinct_questions
from fides_rag.eval.datasets import load_examples


def sample_questions(dataset: str, count: int, seed: int) -> list[str]:
    """`count` distinct questions of `dataset` in a shuffle seeded with `seed` (the strata scan's order)."""
    questions = distinct_questions(e.question for e in load_examples(dataset))
    random.Random(seed).shuffle(questions)
    return questions[:count]


def batches_of(decoder: FidesDecoder, questions: list[str], batch_size: int, max_new_tokens: int) -> dict[str, str]:
    """The lane as it was: `batch_size` questions at a time through `generate_batch`, each batch waiting for its
    slowest answer."""
    answers: dict[str, str] = {}
    for start in range(0, len(questions), batch_size):
        batch = questions[start : start + batch_size]
        results = decoder.generate_batch(batch, [[] for _ in batch], method="standard", max_new_tokens=max_new_tokens)
        answers.update({q: r.text for q, r in zip(batch, results)})
    return answers


def continuous(decoder: FidesDecoder, questions: list[str], in_flight: int, max_new_tokens: int) -> dict[str, str]:
    """The lane as it is: `closed_book_answers` with a fresh cache."""
    settings = closed_book_settings(decoder, model="benchmark", dataset="benchmark", max_new_tokens=max_new_tokens)
    with tempfile.TemporaryDirectory() as folder:
        return closed_book_answers(
            decoder, questions, Path(folder) / "cb.jsonl", settings=settings, in_flight=in_flight
        )


def timed(run: Any) -> tuple[dict[str, str], float]:
    start = time.perf_counter()
    answers = run()
    return answers, time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict[str, Any]:
    questions = sample_questions(args.dataset, args.questions, args.seed)
    decoder = FidesDecoder.from_pretrained(args.backbone, device=args.device, mode="exact")
    decoder.generate(questions[0], [], method="standard", max_new_tokens=2)  # load and warm the kernels once
    old, old_s = timed(lambda: batches_of(decoder, questions, args.batch_size, args.max_new_tokens))
    new, new_s = timed(lambda: continuous(decoder, questions, args.in_flight, args.max_new_tokens))
    lengths = [len(decoder.tokenizer(new[q], add_special_tokens=False)["input_ids"]) for q in questions]
    out: dict[str, Any] = {
        "settings": {
            "backbone": args.backbone,
            "dataset": args.dataset,
            "questions": len(questions),
            "seed": args.seed,
            "max_new_tokens": args.max_new_tokens,
            "batch_size": args.batch_size,
            "in_flight": args.in_flight,
            "mode": "exact",
            "device": str(decoder.device),
            "torch_threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
        },
        "batches": {"seconds": old_s, "questions_per_second": len(questions) / old_s},
        "continuous": {"seconds": new_s, "questions_per_second": len(questions) / new_s},
        "speedup": old_s / new_s,
        "answers_equal": sum(old[q] == new[q] for q in questions),
        "answer_tokens": {"mean": sum(lengths) / len(lengths), "max": max(lengths)},
    }
    if args.fast_sample:
        del decoder
        fast_decoder = FidesDecoder.from_pretrained(args.backbone, device=args.device, mode="fast")
        sample = questions[: args.fast_sample]
        fast, fast_s = timed(lambda: continuous(fast_decoder, sample, args.in_flight, args.max_new_tokens))
        out["fast"] = {
            "questions": len(sample),
            "seconds": fast_s,
            "equal_to_exact": sum(fast[q] == new[q] for q in sample),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="gemma3-270m")
    parser.add_argument("--dataset", default="bigbench-conflicts")
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8, help="the batches the lane used to wait on")
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--fast-sample", type=int, default=0, help="also answer this many in fast mode and compare")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = measure(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
