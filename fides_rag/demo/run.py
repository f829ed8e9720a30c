"""The noisy-retrieval experiment: retrieve top-k, inject 0/20/50% irrelevant documents, answer with
every method over one shared prefill per batch, and score alias accuracy.

`run_demo(DemoSettings(...))` returns the report (a JSON-ready dict) and writes `results.json` and
`accuracy.png` into the run folder (`settings.out_folder()`); `format_table(report)` renders the terminal table.
Answers are appended to `predictions.jsonl` batch by batch (the eval's store, `fides_rag.eval.store`), so rerunning an
interrupted run with the same
--out decodes only what is missing (and a run with an extra method decodes only that method).
"""

from __future__ import annotations

import json
import logging
import platform
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fides_rag.demo.corpus import Corpus, Passage, load_embedded_corpus, load_popqa_corpus
from fides_rag.demo.metrics import contains_alias, is_correct, recall_at_k
from fides_rag.demo.noise import inject_noise, noise_count
from fides_rag.eval.datasets import QAExample
from fides_rag.eval.significance import paired_bootstrap
from fides_rag.eval.store import PredictionStore
from fides_rag.eval.tables import markdown_table, terminal_table
from fides_rag.extras import require

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "gemma3-270m"
DEFAULT_METHODS = ("standard", "cad", "adacad", "fides")
DEFAULT_NOISE = (0.0, 0.2, 0.5)
DEFAULT_K = 4
DEFAULT_LIMITS = {"demo": 24, "popqa": 24}
"""Questions per run when --limit is not given (None: all of them)."""
# What a resumed run must share with the run that wrote predictions.jsonl (the documents are checked per prompt).
_RESUME_KEYS = ("model", "corpus", "max_new_tokens")


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
    load_options: dict[str, Any] | None = None
    """More keyword arguments of `load_model`: dtype, device_map (which replaces `device`), offload_folder."""
    out: str | None = None
    """Run folder; None: runs/demo/<corpus>-<model>, so runs of other models or corpora do not collide."""
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

    def out_folder(self) -> Path:
        if self.out is not None:
            return Path(self.out)
        model = re.sub(r"[^A-Za-z0-9._-]+", "-", self.model.rstrip("/")).strip("-.") or "model"
        return Path("runs") / "demo" / f"{self.corpus}-{model}"

    def effective_limit(self) -> int | None:
        return self.limit if self.limit is not None else DEFAULT_LIMITS[self.corpus]


def load_corpus(settings: DemoSettings) -> Corpus:
    return load_popqa_corpus(settings.data) if settings.corpus == "popqa" else load_embedded_corpus()


def select_questions(corpus: Corpus, limit: int | None, seed: int) -> list[QAExample]:
    """All questions, or `limit` of them drawn round-robin across kinds (embedded: counterfactual,
    longtail, factual; PopQA: the relation), each kind in a seeded random order; kept in corpus order."""
    if limit is None or limit >= len(corpus.questions):
        return list(corpus.questions)
    rng = random.Random(f"fides-demo-questions:{seed}")
    by_kind: dict[str, list[int]] = {}
    for i, q in enumerate(corpus.questions):
        by_kind.setdefault(q.meta["kind"], []).append(i)
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
    key: str = ""
    """'<question id>@<level>': the id of this prompt's line in predictions.jsonl."""
    result: dict[str, dict[str, Any]] = field(default_factory=dict)
    """method -> {'text': answer, 'documents_trimmed': bool}."""


def prompt_example(question: QAExample, level: Any, documents: Sequence[Passage]) -> QAExample:
    """One demo prompt as the common example type: id '<question id>@<noise level>', its documents in prompt order."""
    return QAExample(
        question.question,
        tuple(d.text for d in documents),
        question.context_answers,
        question.memory_answers,
        f"{question.id}@{level_label(level.share)}",
        {"documents": [d.id for d in documents], "form": "conflict" if question.memory_answers else "original"},
    )


def run_demo(
    settings: DemoSettings,
    *,
    decoder: FidesDecoder | None = None,
    retriever: Any = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the experiment; write results.json, results.md and accuracy.png into the run folder; return the report."""
    started = time.perf_counter()
    corpus = load_corpus(settings)
    questions = select_questions(corpus, settings.effective_limit(), settings.seed)
    log(
        f"corpus {corpus.name} ({corpus.source}): {len(corpus.passages)} passages; {len(questions)} of "
        f"{len(corpus.questions)} questions"
    )
    t0 = time.perf_counter()
    retriever, hits, retrieved = _retrieve(settings, corpus, questions, retriever, progress, log)
    recall = recall_at_k([[p.text for p in row] for row in retrieved], [q.context_answers for q in questions])
    retrieval_s = time.perf_counter() - t0
    noisy = [
        inject_noise(
            docs,
            settings.noise,
            corpus.passages,
            q.context_answers,
            seed=settings.seed,
            key=q.id,
            text_of=lambda p: p.text,
            protect_gold=settings.protect_gold,
        )
        for q, docs in zip(questions, retrieved)
    ]
    items = [_Item(qi, li, level.documents) for qi, levels in enumerate(noisy) for li, level in enumerate(levels)]
    examples = [prompt_example(questions[it.question], noisy[it.question][it.level], it.documents) for it in items]
    corpus_id = {k: v for k, v in corpus.describe().items() if k in ("name", "passages_sha256")}
    store = PredictionStore(
        settings.out_folder(),
        {"model": settings.model, "corpus": corpus_id, "max_new_tokens": settings.max_new_tokens},
        _RESUME_KEYS,
        what="demo answers decoded",
    )
    decoder, todo, timing = _decode(settings, store, examples, decoder, progress, log)
    for it, example in zip(items, examples):
        it.key = example.id
        it.result = {m: o for m, o in store.kept_outputs(example).items() if m in settings.methods}
    per_question, table = _score(settings, questions, hits, retrieved, noisy, items)
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
        "retriever": {
            "embedder": retriever.embedder.name,
            "index": "faiss.IndexFlatIP (cosine)",
            "embeddings_from_cache": retriever.from_cache,
            "cache": str(retriever.cache_path),
        },
        "questions": len(questions),
        "recall_at_k": 100.0 * recall,
        **tally(table, settings.methods, [level_label(s) for s in settings.noise]),
        "metric": "accuracy = a gold alias, SQuAD-normalised, occurs as whole tokens in the normalised answer "
        "(percent)",
        "timing_s": {"total": round(time.perf_counter() - started, 1), "retrieval": round(retrieval_s, 1), **timing},
        "decoded_now": todo,
        "decoded_before": len(items) - todo,
        "environment": _environment(decoder),
        "per_question": per_question,
    }
    return _write_report(report, settings.out_folder())


def _retrieve(
    settings: DemoSettings,
    corpus: Corpus,
    questions: Sequence[QAExample],
    retriever: Any,
    progress: bool,
    log: Callable[[str], None],
) -> tuple[Any, list, list[list[Passage]]]:
    """The retriever, its (passage, score) hits best first, and each question's documents in prompt order."""
    if retriever is None:
        from fides_rag.demo.retrieval import Retriever

        retriever = Retriever(corpus, progress=progress)
    log(
        f"index: FAISS flat inner product over {retriever.embedder.name} embeddings "
        f"({'from cache' if retriever.from_cache else 'embedded now'}: {retriever.cache_path})"
    )
    hits = retriever.search([q.question for q in questions], settings.k)
    retrieved = [[p for p, _ in (row[::-1] if settings.doc_order == "best-last" else row)] for row in hits]
    return retriever, hits, retrieved


def _decode(
    settings: DemoSettings,
    store: PredictionStore,
    examples: Sequence[QAExample],
    decoder: FidesDecoder | None,
    progress: bool,
    log: Callable[[str], None],
) -> tuple[Any, int, dict[str, float]]:
    """Decode the prompts the store lacks (loading the model only then); returns the decoder, how many, and timings."""
    from tqdm.auto import tqdm

    todo = len(store.missing(examples, settings.methods))
    if todo < len(examples):
        log(f"resuming from {store.path}: {len(examples) - todo} of {len(examples)} prompts already decoded")
    t0 = time.perf_counter()
    if decoder is None and todo:
        from fides_rag import FidesDecoder, load_model

        model, tokenizer = load_model(settings.model, **{"device": settings.device, **(settings.load_options or {})})
        decoder = FidesDecoder(model, tokenizer)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    bar = tqdm(
        total=len(examples),
        initial=len(examples) - todo,
        desc=f"decoding {len(settings.methods)} methods",
        unit="prompt",
        disable=not progress,
    )
    try:
        store.decode(
            decoder,
            examples,
            {m: m for m in settings.methods},
            batch_size=settings.batch_size,
            max_new_tokens=settings.max_new_tokens,
            on_batch=bar.update,
            prompt_length=lambda e: len(e.question) + sum(len(c) for c in e.contexts),
        )  # characters
    finally:
        bar.close()
    return decoder, todo, {"model_load": round(load_s, 1), "decoding": round(time.perf_counter() - t0, 1)}


def _score(
    settings: DemoSettings,
    questions: Sequence[QAExample],
    hits: list,
    retrieved: list,
    noisy: list,
    items: Sequence[_Item],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per-question records for results.json, and one flat row per (method, level, question) for the tallies."""
    per_question = [
        {
            "id": q.id,
            "question": q.question,
            "answers": list(q.context_answers),
            "kind": q.meta["kind"],
            **({"memory_answers": list(q.memory_answers)} if q.memory_answers else {}),
            "retrieved": [
                {"id": p.id, "score": round(s, 4), "has_answer": contains_alias(p.text, q.context_answers)}
                for p, s in hits[qi]
            ],  # rank order, best first
            "gold_in_top_k": any(contains_alias(p.text, q.context_answers) for p in retrieved[qi]),
            "levels": {},
        }
        for qi, q in enumerate(questions)
    ]
    rows: list[dict[str, Any]] = []
    for it in items:
        q, level = questions[it.question], noisy[it.question][it.level]
        gold = any(
            contains_alias(d.text, q.context_answers) for d in level.documents
        )  # the prompt still holds a gold alias
        entry: dict[str, Any] = {
            "documents": [d.id for d in it.documents],  # prompt order
            "replaced_positions": list(level.replaced),
            "gold_in_documents": gold,
            "predictions": {},
        }
        for method in settings.methods:
            res = it.result[method]
            pred = {"text": res["text"], "correct": is_correct(res["text"], q.context_answers)}
            if q.memory_answers:
                pred["memory"] = is_correct(res["text"], q.memory_answers)
            if res["documents_trimmed"]:
                pred["documents_trimmed"] = True
            entry["predictions"][method] = pred
            rows.append(
                {
                    "method": method,
                    "level": level_label(level.share),
                    "question": it.question,
                    "kind": q.meta["kind"],
                    "correct": pred["correct"],
                    "gold": gold,
                }
            )
        per_question[it.question]["levels"][level_label(level.share)] = entry
    return per_question, rows


def tally(rows: Sequence[dict[str, Any]], methods: Sequence[str], levels: Sequence[str]) -> dict[str, Any]:
    """Accuracy (%) per method and level, overall, on prompts holding a gold passage and per kind; the drop; the
    bootstrap."""
    pd = require("pandas", "eval", purpose="the demo's tallies")
    frame = pd.DataFrame(list(rows))

    def percent(group: Any, keys: list[str]) -> dict:
        counts = group.groupby(keys)["correct"].agg(["sum", "count"])
        return {key: 100.0 * int(row["sum"]) / int(row["count"]) for key, row in counts.iterrows()}

    overall, given = percent(frame, ["method", "level"]), percent(frame[frame["gold"]], ["method", "level"])
    accuracy = {m: {lv: overall[(m, lv)] for lv in levels} for m in methods}
    first_method = frame[frame["method"] == methods[0]]
    gold_share = first_method.groupby("level")["gold"].agg(["sum", "count"])
    by_kind = percent(frame, ["kind", "method", "level"])
    correct = {
        m: [
            frame[(frame["method"] == m) & (frame["level"] == lv)].sort_values("question")["correct"].tolist()
            for lv in levels
        ]
        for m in methods
    }
    return {
        "answer_in_documents": {
            lv: 100.0 * int(gold_share.loc[lv, "sum"]) / int(gold_share.loc[lv, "count"]) for lv in levels
        },
        # Accuracy on the prompts that still hold an answering passage: reading, apart from retrieval's misses.
        "accuracy_given_gold": {m: {lv: given.get((m, lv)) for lv in levels} for m in methods},
        "accuracy": accuracy,
        "drop": {m: accuracy[m][levels[0]] - accuracy[m][levels[-1]] for m in methods},
        "drop_between": [levels[0], levels[-1]],
        "accuracy_by_kind": {
            kind: {m: {lv: by_kind[(kind, m, lv)] for lv in levels} for m in methods}
            for kind in sorted(frame["kind"].unique())
        },
        "significance": compare_methods(correct, methods, levels),
    }


def _environment(decoder: FidesDecoder) -> dict[str, str]:
    import torch

    import fides_rag

    return {
        "fides_rag": getattr(fides_rag, "__version__", "?"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(getattr(decoder, "device", "?")),
    }


def _write_report(report: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write accuracy.png, results.md and results.json into `out`; return the report with their paths."""
    report["files"] = {
        "json": str(out / "results.json"),
        "markdown": str(out / "results.md"),
        "plot": str(out / "accuracy.png"),
    }
    plot_accuracy(report, out / "accuracy.png")
    (out / "results.md").write_text(results_markdown(report), encoding="utf-8")
    (out / "results.json").write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    return report


def compare_methods(
    correct: dict[str, list[list[bool]]],
    methods: Sequence[str],
    levels: Sequence[str],
    *,
    samples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Paired bootstrap (over questions) of the reference method (fides if run, else the last method)
    against each other method: accuracy at every noise level, and the drop from the first level to the last.

    `correct[method][level][question]`; differences are reference − other, in percentage points.
    """
    reference = "fides" if "fides" in methods else methods[-1]

    def points(result: dict[str, Any]) -> dict[str, Any]:
        return {**result, **{k: 100.0 * result[k] for k in ("diff", "ci_low", "ci_high") if result[k] is not None}}

    def drops(method: str) -> list[float]:
        return [float(a) - float(b) for a, b in zip(correct[method][0], correct[method][-1])]

    pairs: dict[str, Any] = {}
    for other in methods:
        if other == reference:
            continue
        pairs[other] = {
            "accuracy": {
                lv: points(paired_bootstrap(correct[reference][li], correct[other][li], samples=samples, seed=seed))
                for li, lv in enumerate(levels)
            },
            "drop": points(paired_bootstrap(drops(reference), drops(other), samples=samples, seed=seed)),
        }
    return {"reference": reference, "samples": samples, "confidence": 0.95, "versus": pairs}


def format_table(report: dict[str, Any]) -> str:
    """The accuracy table for the terminal (rich): one row per method, one column per noise level, and the drop."""
    levels = report["noise_levels"]
    first, last = report["drop_between"]
    lines = [
        f"Noisy retrieval: {report['corpus']['name']}, {report['questions']} questions, model {report['model']}, "
        f"k={report['k']}, seed={report['seed']}, documents {report.get('doc_order', 'best-first')}",
        f"retrieval recall@{report['k']}: {report['recall_at_k']:.1f}%  "
        f"(irrelevant documents per level: " + ", ".join(f"{lv}={c}" for lv, c in report["noise_counts"].items()) + ")",
    ]
    rows = [
        [m] + [f"{report['accuracy'][m][lv]:.1f}" for lv in levels] + [f"{report['drop'][m]:+.1f}"]
        for m in report["methods"]
    ]
    if "answer_in_documents" in report:  # % of prompts whose documents still hold a gold alias
        rows.append(["gold doc"] + [f"{report['answer_in_documents'][lv]:.1f}" for lv in levels] + [""])
    lines.append(
        terminal_table(
            ["method", *levels, f"drop {first}->{last}"],
            rows,
            title="accuracy (%): a gold alias in the answer; gold doc: % of prompts still holding one",
        )
    )
    sig = report.get("significance")
    if sig and sig["versus"]:
        sig_rows = [
            [f"vs {other}"] + [_ci(pair["accuracy"][lv]) for lv in levels] + [_ci(pair["drop"])]
            for other, pair in sig["versus"].items()
        ]
        lines.append(
            terminal_table(
                ["", *levels, "drop"],
                sig_rows,
                title=f"paired bootstrap, {sig['reference']} − other in points [95% CI] (B={sig['samples']})",
            )
        )
    return "\n".join(lines)


def results_markdown(report: dict[str, Any]) -> str:
    """The accuracy table and the paired bootstrap as markdown (written to results.md beside results.json)."""
    levels = report["noise_levels"]
    first, last = report["drop_between"]
    lines = [
        f"{report['corpus']['name']}, {report['questions']} questions, model {report['model']}, k = {report['k']}, "
        f"seed {report['seed']}, documents {report.get('doc_order', 'best-first')}; retrieval recall@{report['k']} "
        f"{report['recall_at_k']:.1f}%. Accuracy (%): a gold alias in the answer.",
        "",
    ]
    rows = [
        [m] + [f"{report['accuracy'][m][lv]:.1f}" for lv in levels] + [f"{report['drop'][m]:+.1f}"]
        for m in report["methods"]
    ]
    if "answer_in_documents" in report:
        rows.append(
            ["*prompts still holding a gold passage*"]
            + [f"*{report['answer_in_documents'][lv]:.1f}*" for lv in levels]
            + [""]
        )
    lines.append(markdown_table(["method", *levels, f"drop {first} → {last}"], rows))
    if "accuracy_given_gold" in report:
        lines += [
            "",
            "Accuracy (%) on the prompts that still hold a gold passage (reading, apart from retrieval misses):",
            "",
        ]
        given = report["accuracy_given_gold"]
        lines.append(
            markdown_table(
                ["method", *levels],
                [
                    [m] + ["–" if given[m][lv] is None else f"{given[m][lv]:.1f}" for lv in levels]
                    for m in report["methods"]
                ],
            )
        )
    sig = report.get("significance")
    if sig and sig["versus"]:
        lines += [
            "",
            f"Paired bootstrap over questions (B = {sig['samples']}, two-sided 95% CI; p from a paired permutation "
            "test), "
            f"{sig['reference']} minus the other method, in points:",
            "",
        ]
        sig_rows = [
            [other] + [_ci(pair["accuracy"][lv], markdown=True) for lv in levels] + [_ci(pair["drop"], markdown=True)]
            for other, pair in sig["versus"].items()
        ]
        lines.append(markdown_table([f"{sig['reference']} vs", *levels, "drop"], sig_rows))
    return "\n".join(lines) + "\n"


def _ci(result: dict[str, Any], markdown: bool = False) -> str:
    """One bootstrap result as 'diff [low,high]'; as markdown also its p, in bold when the CI excludes 0."""
    if result["diff"] is None:
        return "n/a"
    if not markdown:
        return f"{result['diff']:+.1f} [{result['ci_low']:+.1f},{result['ci_high']:+.1f}]"
    text = f"{result['diff']:+.1f} [{result['ci_low']:+.1f}, {result['ci_high']:+.1f}], p = {result['p_value']:.2g}"
    return f"**{text}**" if result["ci_low"] > 0 or result["ci_high"] < 0 else text


def plot_accuracy(report: dict[str, Any], path: str | Path) -> Path:
    """Accuracy against the share of irrelevant documents, one line per method (matplotlib, Agg)."""
    matplotlib = require("matplotlib", purpose="the demo's plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = report["noise_levels"]
    xs = [float(lv.rstrip("%")) for lv in levels]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for method in report["methods"]:
        ax.plot(
            xs,
            [report["accuracy"][method][lv] for lv in levels],
            marker="o",
            linewidth=2 if method == "fides" else 1.3,
            label=f"{method} (drop {report['drop'][method]:+.1f})",
        )
    ax.set_xticks(xs)
    ax.set_xticklabels(levels)
    ax.set_xlabel("irrelevant documents among the top-k")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(
        f"{report['corpus']['name']} · {report['model']} · k={report['k']} · n={report['questions']}", fontsize=9
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
