"""The noisy-retrieval experiment: retrieve top-k, inject 0/20/50% irrelevant documents, answer with
every method over one shared prefill per batch, and score alias accuracy.

`run_demo(DemoSettings(...))` returns the report (a JSON-ready dict) and writes `results.json` and
`accuracy.png` into `settings.out`; `format_table(report)` renders the terminal table.
"""

from __future__ import annotations

import json
import logging
import platform
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fides_rag.demo.corpus import Corpus, DemoQuestion, Passage, load_embedded_corpus, load_popqa_corpus
from fides_rag.demo.metrics import contains_alias, is_correct, recall_at_k
from fides_rag.demo.noise import inject_noise, noise_count

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "gemma3-270m"
DEFAULT_METHODS = ("standard", "cad", "adacad", "fides")
DEFAULT_NOISE = (0.0, 0.2, 0.5)
DEFAULT_K = 4
DEFAULT_LIMITS = {"demo": 24, "popqa": 24}
"""Questions per run when --limit is not given (None: all of them)."""


@dataclass
class DemoSettings:
    corpus: str = "demo"
    """'demo' (the embedded corpus) or 'popqa'."""
    data: str | None = None
    """PopQA folder (holding popqa_longtail.jsonl and popqa_longtail_passages.txt, or a popqa/ subfolder)."""
    model: str = DEFAULT_MODEL
    methods: tuple[str, ...] = DEFAULT_METHODS
    k: int = DEFAULT_K
    noise: tuple[float, ...] = DEFAULT_NOISE
    seed: int = 0
    limit: int | None = None
    batch_size: int = 8
    max_new_tokens: int = 16
    device: str = "auto"
    out: str = "runs/demo"
    protect_gold: bool = False
    """Replace documents that contain a gold alias only after all others (default: positions fully random)."""
    doc_order: str = "best-last"
    """Prompt order of the retrieved documents: 'best-last' (the most similar next to the question; small
    models read it far better) or 'best-first' (rank order)."""

    def __post_init__(self) -> None:
        if self.corpus not in ("demo", "popqa"):
            raise ValueError(f"corpus must be 'demo' or 'popqa', got {self.corpus!r}")
        if self.k <= 0:
            raise ValueError(f"k must be positive, got {self.k}")
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        if self.limit is not None and self.limit <= 0:
            raise ValueError(f"limit must be positive, got {self.limit}")
        if self.doc_order not in ("best-last", "best-first"):
            raise ValueError(f"doc_order must be 'best-last' or 'best-first', got {self.doc_order!r}")
        if not self.methods:
            raise ValueError("methods must name at least one method")
        self.methods = tuple(self.methods)
        self.noise = tuple(sorted(set(float(s) for s in self.noise)))
        for share in self.noise:
            noise_count(share, self.k)  # validates the range

    def effective_limit(self) -> int | None:
        return self.limit if self.limit is not None else DEFAULT_LIMITS[self.corpus]


def load_corpus(settings: DemoSettings) -> Corpus:
    return load_popqa_corpus(settings.data) if settings.corpus == "popqa" else load_embedded_corpus()


def select_questions(corpus: Corpus, limit: int | None, seed: int) -> list[DemoQuestion]:
    """All questions, or `limit` of them drawn round-robin across kinds (embedded: counterfactual,
    longtail, factual; PopQA: the relation), each kind in a seeded random order; kept in corpus order."""
    if limit is None or limit >= len(corpus.questions):
        return list(corpus.questions)
    rng = random.Random(f"fides-demo-questions:{seed}")
    by_kind: dict[str, list[int]] = {}
    for i, q in enumerate(corpus.questions):
        by_kind.setdefault(q.kind, []).append(i)
    queues = [rng.sample(idx, len(idx)) for _, idx in sorted(by_kind.items())]
    chosen: list[int] = []
    while len(chosen) < limit:
        for queue in queues:
            if queue and len(chosen) < limit:
                chosen.append(queue.pop())
    return [corpus.questions[i] for i in sorted(chosen)]


def level_label(share: float) -> str:
    return f"{round(share * 100):d}%"


@dataclass
class _Item:
    question: int
    level: int
    documents: tuple[Passage, ...]
    result: dict[str, Any] = field(default_factory=dict)


def _batches(items: list[_Item], questions: Sequence[DemoQuestion], batch_size: int) -> list[list[_Item]]:
    """Items sorted by prompt length (characters), cut into batches, so each batch pads little."""
    order = sorted(items, key=lambda it: len(questions[it.question].question) + sum(len(d.text) for d in it.documents))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def run_demo(
    settings: DemoSettings,
    *,
    decoder: Any = None,
    retriever: Any = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the experiment; write results.json and accuracy.png into settings.out; return the report."""
    from tqdm.auto import tqdm

    started = time.perf_counter()
    corpus = load_corpus(settings)
    questions = select_questions(corpus, settings.effective_limit(), settings.seed)
    log(f"corpus {corpus.name} ({corpus.source}): {len(corpus.passages)} passages; {len(questions)} of {len(corpus.questions)} questions")

    # Retrieval.
    t0 = time.perf_counter()
    if retriever is None:
        from fides_rag.demo.retrieval import Retriever

        retriever = Retriever(corpus, progress=progress)
    log(f"index: FAISS flat inner product over {retriever.embedder.name} embeddings "
        f"({'from cache' if retriever.from_cache else 'embedded now'}: {retriever.cache_path})")
    hits = retriever.search([q.question for q in questions], settings.k)
    retrieved = [[p for p, _ in (row[::-1] if settings.doc_order == "best-last" else row)] for row in hits]
    recall = recall_at_k([[p.text for p in row] for row in retrieved], [q.answers for q in questions])
    retrieval_s = time.perf_counter() - t0

    # Noise.
    noisy = [
        inject_noise(docs, settings.noise, corpus.passages, q.answers, seed=settings.seed, key=q.id,
                     text_of=lambda p: p.text, protect_gold=settings.protect_gold)
        for q, docs in zip(questions, retrieved)
    ]
    items = [_Item(qi, li, level.documents) for qi, levels in enumerate(noisy) for li, level in enumerate(levels)]

    # Decoding: every method over one shared prefill per batch.
    t0 = time.perf_counter()
    if decoder is None:
        from fides_rag import FidesDecoder, load_model

        model, tokenizer = load_model(settings.model, device=settings.device)
        decoder = FidesDecoder(model, tokenizer)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    bar = tqdm(total=len(items), desc=f"decoding {len(settings.methods)} methods", unit="prompt", disable=not progress)
    for batch in _batches(items, questions, settings.batch_size):
        outputs = decoder.generate_methods(
            [questions[it.question].question for it in batch],
            [[d.text for d in it.documents] for it in batch],
            list(settings.methods),
            max_new_tokens=settings.max_new_tokens,
        )
        for method, results in outputs.items():
            for it, res in zip(batch, results):
                it.result[method] = res
        bar.update(len(batch))
    bar.close()
    decode_s = time.perf_counter() - t0

    # Scoring.
    correct = {m: [[False] * len(questions) for _ in settings.noise] for m in settings.methods}
    per_question: list[dict[str, Any]] = []
    for qi, q in enumerate(questions):
        per_question.append({
            "id": q.id, "question": q.question, "answers": list(q.answers), "kind": q.kind,
            **({"memory_answers": list(q.memory_answers)} if q.memory_answers else {}),
            "retrieved": [  # rank order, best first
{"id": p.id, "score": round(s, 4), "has_answer": contains_alias(p.text, q.answers)} for p, s in hits[qi]],
            "gold_in_top_k": any(contains_alias(p.text, q.answers) for p in retrieved[qi]),
            "levels": {},
        })
    for it in items:
        q = questions[it.question]
        level = noisy[it.question][it.level]
        entry: dict[str, Any] = {
            "documents": [d.id for d in it.documents],  # prompt order
            "replaced_positions": list(level.replaced),
            "gold_in_documents": any(contains_alias(d.text, q.answers) for d in it.documents),
            "predictions": {},
        }
        for method in settings.methods:
            res = it.result[method]
            ok = is_correct(res.text, q.answers)
            correct[method][it.level][it.question] = ok
            pred = {"text": res.text, "correct": ok}
            if q.memory_answers:
                pred["memory"] = is_correct(res.text, q.memory_answers)
            if res.documents_trimmed:
                pred["documents_trimmed"] = True
            entry["predictions"][method] = pred
        per_question[it.question]["levels"][level_label(level.share)] = entry

    n = len(questions)
    accuracy = {m: {level_label(s): 100.0 * sum(correct[m][li]) / n for li, s in enumerate(settings.noise)} for m in settings.methods}
    answer_in_documents = {
        level_label(s): 100.0 * sum(any(contains_alias(d.text, q.answers) for d in noisy[qi][li].documents)
                                    for qi, q in enumerate(questions)) / n
        for li, s in enumerate(settings.noise)
    }
    first, last = level_label(settings.noise[0]), level_label(settings.noise[-1])
    drop = {m: accuracy[m][first] - accuracy[m][last] for m in settings.methods}
    by_kind: dict[str, dict[str, dict[str, float]]] = {}
    for kind in sorted({q.kind for q in questions}):
        idx = [i for i, q in enumerate(questions) if q.kind == kind]
        by_kind[kind] = {
            m: {level_label(s): 100.0 * sum(correct[m][li][i] for i in idx) / len(idx) for li, s in enumerate(settings.noise)}
            for m in settings.methods
        }
    wall_s = time.perf_counter() - started

    import fides_rag
    import torch

    report: dict[str, Any] = {
        "settings": {**asdict(settings), "limit_used": settings.effective_limit()},
        "model": settings.model,
        "methods": list(settings.methods),
        "seed": settings.seed,
        "k": settings.k,
        "doc_order": settings.doc_order,
        "noise_levels": [level_label(s) for s in settings.noise],
        "noise_counts": {level_label(s): noise_count(s, settings.k) for s in settings.noise},
        "corpus": corpus.describe(),
        "retriever": {"embedder": retriever.embedder.name, "index": "faiss.IndexFlatIP (cosine)",
                      "embeddings_from_cache": retriever.from_cache, "cache": str(retriever.cache_path)},
        "questions": n,
        "recall_at_k": 100.0 * recall,
        "answer_in_documents": answer_in_documents,
        "accuracy": accuracy,
        "drop": drop,
        "drop_between": [first, last],
        "accuracy_by_kind": by_kind,
        "metric": "accuracy = a gold alias, SQuAD-normalised, occurs as whole tokens in the normalised answer (percent)",
        "timing_s": {"total": round(wall_s, 1), "retrieval": round(retrieval_s, 1), "model_load": round(load_s, 1),
                     "decoding": round(decode_s, 1)},
        "environment": {"fides_rag": getattr(fides_rag, "__version__", "?"), "torch": torch.__version__,
                        "python": platform.python_version(), "device": str(getattr(decoder, "device", "?"))},
        "per_question": per_question,
    }
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    report["files"] = {"json": str(out / "results.json"), "plot": str(out / "accuracy.png")}
    plot_accuracy(report, out / "accuracy.png")
    (out / "results.json").write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    return report


def format_table(report: dict[str, Any]) -> str:
    """The accuracy table: one row per method, one column per noise level, and the drop."""
    levels = report["noise_levels"]
    first, last = report["drop_between"]
    head = f"{'method':<10}" + "".join(f"{lv:>8}" for lv in levels) + f"{'drop ' + first + '->' + last:>16}"
    rule = "-" * len(head)
    lines = [
        f"Noisy retrieval: {report['corpus']['name']}, {report['questions']} questions, model {report['model']}, "
        f"k={report['k']}, seed={report['seed']}, documents {report.get('doc_order', 'best-first')}",
        f"retrieval recall@{report['k']}: {report['recall_at_k']:.1f}%  "
        f"(irrelevant documents per level: " + ", ".join(f"{lv}={c}" for lv, c in report["noise_counts"].items()) + ")",
        "accuracy (%): a gold alias in the answer",
        rule, head, rule,
    ]
    for method in report["methods"]:
        row = report["accuracy"][method]
        lines.append(f"{method:<10}" + "".join(f"{row[lv]:>8.1f}" for lv in levels) + f"{report['drop'][method]:>+16.1f}")
    lines.append(rule)
    if "answer_in_documents" in report:
        row = report["answer_in_documents"]
        lines.append(f"{'gold doc':<10}" + "".join(f"{row[lv]:>8.1f}" for lv in levels)
                     + "   (% of prompts whose documents still hold a gold alias)")
    return "\n".join(lines)


def plot_accuracy(report: dict[str, Any], path: str | Path) -> Path:
    """Accuracy against the share of irrelevant documents, one line per method (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = report["noise_levels"]
    xs = [float(lv.rstrip("%")) for lv in levels]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for method in report["methods"]:
        ax.plot(xs, [report["accuracy"][method][lv] for lv in levels], marker="o", linewidth=2 if method == "fides" else 1.3,
                label=f"{method} (drop {report['drop'][method]:+.1f})")
    ax.set_xticks(xs)
    ax.set_xticklabels(levels)
    ax.set_xlabel("irrelevant documents among the top-k")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(f"{report['corpus']['name']} · {report['model']} · k={report['k']} · n={report['questions']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
