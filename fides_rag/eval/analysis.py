"""Analyses of an eval run folder (`fides-rag analyze RUN_DIR`), each writing JSON and a PNG (matplotlib, Agg).

1. token selectivity: mean alpha per token category and the AUROC of alpha for answer tokens;
2. conflict severity: CF per first-step-JSD quartile per method;
3. non-conflict control: CF/EM/F1 and mean alpha on aligned evidence;
4. one example's trace: answer tokens coloured by alpha with the three signals underneath (PNG + HTML).
"""

from __future__ import annotations

import html
import json
import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fides_rag.eval.metrics import aggregate, normalize_answer
from fides_rag.eval.records import read_predictions
from fides_rag.eval.store import PREDICTIONS
from fides_rag.extras import require

ANALYSIS_DIR = "analysis"
CATEGORIES = ("answer", "function", "numeric/entity", "other")
SIGNALS = ("opposition", "shift", "noise")
# A fixed English function-word list. Kept rather than sklearn's ENGLISH_STOP_WORDS: that list (318 words) also holds
# content words ("fire", "bill", "system", "computer", "found", numbers like "two"), which would count as function
# tokens.
STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "nor",
        "so",
        "yet",
        "if",
        "then",
        "than",
        "that",
        "this",
        "these",
        "those",
        "there",
        "here",
        "of",
        "in",
        "on",
        "at",
        "by",
        "for",
        "with",
        "about",
        "against",
        "between",
        "into",
        "through",
        "during",
        "before",
        "after",
        "above",
        "below",
        "to",
        "from",
        "up",
        "down",
        "out",
        "off",
        "over",
        "under",
        "again",
        "further",
        "once",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "have",
        "has",
        "had",
        "having",
        "do",
        "does",
        "did",
        "doing",
        "will",
        "would",
        "shall",
        "should",
        "can",
        "could",
        "may",
        "might",
        "must",
        "i",
        "me",
        "my",
        "we",
        "our",
        "you",
        "your",
        "he",
        "him",
        "his",
        "she",
        "her",
        "it",
        "its",
        "they",
        "them",
        "their",
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "when",
        "where",
        "why",
        "how",
        "all",
        "any",
        "both",
        "each",
        "few",
        "more",
        "most",
        "other",
        "some",
        "such",
        "no",
        "not",
        "only",
        "own",
        "same",
        "too",
        "very",
        "just",
        "also",
        "as",
        "s",
        "t",
    ]
)
_HAS_DIGIT = re.compile(r"\d")


def _plt():
    matplotlib = require("matplotlib", purpose="the analysis plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grouped_bars(
    path: Path, series: dict[str, list[float]], ticks: list[str], *, ylabel: str, title: str, width: float = 5.5
) -> None:
    """One bar group per method (tick), one bar per series; saved as a PNG."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(width, 3.5))
    bar = 0.8 / max(1, len(series))
    for k, (name, values) in enumerate(series.items()):
        ax.bar(np.arange(len(ticks)) + k * bar, values, bar, label=name)
    ax.set_xticks(np.arange(len(ticks)) + 0.4 - bar / 2, ticks, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load_run(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / PREDICTIONS
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir}; pass the --out folder of a `fides-rag eval` run")
    if not path.is_file():
        raise FileNotFoundError(f"no {PREDICTIONS} in {run_dir}; run `fides-rag eval --out {run_dir}` first")
    return sorted(read_predictions(path), key=lambda r: r["id"])


def _labels(records: Sequence[dict[str, Any]]) -> list[str]:
    labels: list[str] = []
    for r in records:
        for label in r["outputs"]:
            if label not in labels:
                labels.append(label)
    return labels


def _alpha_labels(records: Sequence[dict[str, Any]]) -> list[str]:
    """Methods whose steps carry an alpha (the contrastive ones)."""
    return [
        label
        for label in _labels(records)
        if any(s.get("alpha") is not None for r in records for s in r["outputs"].get(label, {}).get("steps", []))
    ]


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


# -- 1. token selectivity ----------------------------------------------------------------------------


def token_category(token: str, context_answers: Sequence[str]) -> str:
    """The category of one generated token, first match wins.

    - answer: the normalised token is non-empty and either equals a word of a normalised context answer or,
      when at least 3 characters long, is part of one (sub-word pieces of an answer word);
    - function: the lower-cased token, stripped of whitespace and punctuation, is in STOP_WORDS;
    - numeric/entity: the token holds a digit or starts with a capital letter;
    - other: everything else (punctuation, whitespace, lower-case content words).
    """
    norm = normalize_answer(token)
    if norm:
        words = {w for a in context_answers for w in normalize_answer(a).split()}
        if norm in words or (len(norm) >= 3 and any(norm in w for w in words)):
            return "answer"
    stripped = token.strip()
    if stripped.lower().strip(string.punctuation) in STOP_WORDS:
        return "function"
    if _HAS_DIGIT.search(stripped) or (stripped[:1].isalpha() and stripped[:1].isupper()):
        return "numeric/entity"
    return "other"


def auroc(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """P(score of a positive > score of a negative), ties counting 1/2 (sklearn's roc_auc_score); None without both
    classes."""
    labels = np.asarray(positive, bool)
    if labels.all() or not labels.any():
        return None
    metrics = require("sklearn.metrics", "eval", purpose="the AUROC")
    return float(metrics.roc_auc_score(labels, np.asarray(scores, float)))


def token_selectivity(records: Sequence[dict[str, Any]], out_dir: Path | None = None) -> dict[str, Any]:
    """Mean alpha per token category and AUROC(answer vs rest), per contrastive method."""
    result: dict[str, Any] = {"categories": list(CATEGORIES), "methods": {}}
    for label in _alpha_labels(records):
        by_cat: dict[str, list[float]] = {c: [] for c in CATEGORIES}
        alphas, is_answer = [], []
        for r in records:
            for step in r["outputs"].get(label, {}).get("steps", []):
                if step.get("alpha") is None:
                    continue
                cat = token_category(step["token"], r["context_answers"])
                by_cat[cat].append(step["alpha"])
                alphas.append(step["alpha"])
                is_answer.append(cat == "answer")
        result["methods"][label] = {
            "mean_alpha": {c: (float(np.mean(v)) if v else None) for c, v in by_cat.items()},
            "count": {c: len(v) for c, v in by_cat.items()},
            "auroc_answer_vs_rest": auroc(alphas, is_answer),
        }
    if out_dir is not None:
        _write_json(out_dir / "token_selectivity.json", result)
        labels = list(result["methods"])
        _grouped_bars(
            out_dir / "token_selectivity.png",
            {cat: [result["methods"][label]["mean_alpha"][cat] or 0.0 for label in labels] for cat in CATEGORIES},
            [f"{label}\nAUROC {_f(result['methods'][label]['auroc_answer_vs_rest'])}" for label in labels],
            ylabel="mean α",
            title="Token selectivity: mean α per token category",
            width=max(5, 1.6 * len(labels) + 3),
        )
    return result


def _f(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


# -- 2. conflict severity ----------------------------------------------------------------------------


def first_step_jsd(record: dict[str, Any]) -> float | None:
    """steps[0].opposition of any two-path method (identical across methods: the generated prefix is empty)."""
    for out in record["outputs"].values():
        steps = out.get("steps") or []
        if steps and steps[0].get("opposition") is not None:
            return steps[0]["opposition"]
    return None


def conflict_severity(
    records: Sequence[dict[str, Any]], out_dir: Path | None = None, buckets: int = 4
) -> dict[str, Any]:
    """CF per method in quartiles of first-step JSD (examples sorted by JSD, split into `buckets` near-equal groups).

    Uses conflict-form samples and CF; a run without them falls back to EM on all samples (`metric` says which).
    """
    conflict = [r for r in records if r.get("conflict")]
    metric, pool = ("cf", conflict) if conflict else ("em", list(records))
    with_jsd = [(first_step_jsd(r), r) for r in pool]
    scored = sorted([(j, r) for j, r in with_jsd if j is not None], key=lambda x: x[0])
    labels = _labels(records)
    pd = require("pandas", "eval", purpose="the severity quartiles")
    # Equal-count buckets of the JSD ranks (ties broken by order), so equal JSDs cannot empty a bucket.
    bucket_of = (
        pd.qcut(pd.Series(range(len(scored))), min(buckets, len(scored)), labels=False)
        if scored
        else pd.Series([], dtype=int)
    )
    groups = [np.flatnonzero(bucket_of.to_numpy() == k) for k in range(int(bucket_of.max()) + 1)] if scored else []
    rows = []
    for k, group in enumerate(groups):
        members = [scored[i] for i in group]
        row: dict[str, Any] = {
            "bucket": k + 1,
            "n": len(members),
            "jsd_min": members[0][0],
            "jsd_max": members[-1][0],
            "jsd_mean": float(np.mean([j for j, _ in members])),
            "score": {},
        }
        for label in labels:
            values = [r["outputs"][label]["scores"][metric] for _, r in members if label in r["outputs"]]
            row["score"][label] = 100 * float(np.mean(values)) if values else None
        rows.append(row)
    result = {"metric": metric, "buckets": rows, "methods": labels, "examples_with_jsd": len(scored)}
    if out_dir is not None:
        _write_json(out_dir / "conflict_severity.json", result)
        plt = _plt()
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        x = [row["bucket"] for row in rows]
        for label in labels:
            ax.plot(
                x,
                [row["score"][label] if row["score"][label] is not None else np.nan for row in rows],
                marker="o",
                label=label,
            )
        ax.set_xticks(x, [f"Q{row['bucket']}\n{row['jsd_mean']:.3f}" for row in rows] if rows else [])
        ax.set_xlabel("first-step JSD bucket (mean JSD)")
        ax.set_ylabel(f"{metric.upper()} (%)")
        ax.set_title("Conflict severity")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "conflict_severity.png", dpi=120)
        plt.close(fig)
    return result


# -- 3. non-conflict control -------------------------------------------------------------------------


def non_conflict_control(records: Sequence[dict[str, Any]], out_dir: Path | None = None) -> dict[str, Any]:
    """EM, F1, accuracy and mean alpha per method on non-conflict (aligned-evidence) samples.

    On aligned evidence the context answer is the true answer, so "cf" here is EM against it (the
    fidelity a method keeps when there is nothing to override).
    """
    aligned = [r for r in records if not r.get("conflict")]
    methods = {}
    for label in _labels(aligned):
        outs = [r["outputs"][label] for r in aligned if label in r["outputs"]]
        summary = aggregate([o["scores"] for o in outs], ("em", "f1", "accuracy"))
        summary["cf"] = summary["em"]
        alphas = [s["alpha"] for o in outs for s in o["steps"] if s.get("alpha") is not None]
        summary["mean_alpha"] = float(np.mean(alphas)) if alphas else None
        summary["n"] = len(outs)
        methods[label] = summary
    result = {"examples": len(aligned), "methods": methods}
    if not aligned:
        result["note"] = (
            "no non-conflict samples in this run; evaluate --dataset nq-open, nq-swap-original or nq-swap-both"
        )
    if out_dir is not None:
        _write_json(out_dir / "non_conflict_control.json", result)
        labels = list(methods)
        _grouped_bars(
            out_dir / "non_conflict_control.png",
            {
                metric.upper(): [methods[label][metric] or 0.0 for label in labels]
                for metric in ("em", "f1", "accuracy")
            },
            [f"{label}\nα {_f(methods[label]['mean_alpha'], 2)}" for label in labels],
            ylabel="%",
            title=f"Non-conflict control ({len(aligned)} examples)",
        )
    return result


# -- 4. one example's trace --------------------------------------------------------------------------


def _pick_trace(records: Sequence[dict[str, Any]], method: str) -> dict[str, Any] | None:
    """The first conflict example whose answer under `method` holds an answer token; else any with steps."""
    candidates = [r for r in records if method in r["outputs"] and r["outputs"][method]["steps"]]
    for r in candidates:
        if r.get("conflict") and any(
            token_category(s["token"], r["context_answers"]) == "answer" for s in r["outputs"][method]["steps"]
        ):
            return r
    return candidates[0] if candidates else None


def example_trace(
    records: Sequence[dict[str, Any]],
    out_dir: Path | None = None,
    method: str | None = None,
    example_id: str | None = None,
) -> dict[str, Any]:
    """Tokens of one answer with their alpha and signals; PNG (tokens coloured by alpha, signals below) and HTML."""
    alpha_labels = _alpha_labels(records)
    method = method or ("fides" if "fides" in alpha_labels else (alpha_labels[0] if alpha_labels else None))
    if method is None:
        return {"note": "no method with per-token alpha in this run"}
    if example_id is not None:
        matches = [r for r in records if r["id"] == example_id]
        if not matches:
            raise ValueError(f"no example with id {example_id!r} in the run")
        record: dict[str, Any] | None = matches[0]
    else:
        record = _pick_trace(records, method)
    if record is None:
        return {"note": f"no {method} answer with tokens in this run"}
    steps = record["outputs"][method]["steps"]
    result = {
        "id": record["id"],
        "method": method,
        "question": record["question"],
        "context_answers": record["context_answers"],
        "memory_answers": record["memory_answers"],
        "answer": record["outputs"][method]["text"],
        "tokens": [{k: s.get(k) for k in ("token", "alpha", *SIGNALS)} for s in steps],
    }
    if out_dir is None:
        return result
    _write_json(out_dir / "trace.json", result)
    plt = _plt()
    from matplotlib import cm, colors

    alphas = [s.get("alpha") or 0.0 for s in steps]
    norm = colors.Normalize(vmin=0.0, vmax=max(1.0, max(alphas, default=1.0)))
    cmap = cm.get_cmap("viridis") if hasattr(cm, "get_cmap") else plt.get_cmap("viridis")
    n = len(steps)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6, 0.7 * n + 1.5), 4.2), gridspec_kw={"height_ratios": [1, 2]})
    for i, s in enumerate(steps):
        top.add_patch(plt.Rectangle((i, 0), 0.95, 1, color=cmap(norm(alphas[i]))))
        label = s["token"].replace("\n", "⏎").replace("$", r"\$") or "∅"
        top.text(
            i + 0.475,
            0.5,
            label,
            ha="center",
            va="center",
            fontsize=8,
            color="white" if norm(alphas[i]) < 0.6 else "black",
            rotation=0 if len(label) < 6 else 45,
        )
    top.set_xlim(0, max(n, 1))
    top.set_ylim(0, 1)
    top.axis("off")
    top.set_title(f"{record['id']} · {method}: {record['question'][:80]}", fontsize=9)
    fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=top, orientation="vertical", label="α", fraction=0.03)
    x = np.arange(n) + 0.475
    for name in SIGNALS:
        bottom.plot(x, [s.get(name) if s.get(name) is not None else np.nan for s in steps], marker="o", label=name)
    bottom.plot(x, alphas, color="black", linestyle="--", label="α")
    bottom.set_xlim(0, max(n, 1))
    bottom.set_xticks(x, [s["token"].replace("$", r"\$") for s in steps], rotation=60, fontsize=7)
    bottom.set_ylabel("signal")
    bottom.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(out_dir / "trace.png", dpi=120)
    plt.close(fig)

    spans = []
    for s, a in zip(steps, alphas):
        rgba = cmap(norm(a))
        color = "#" + "".join(f"{int(255 * c):02x}" for c in rgba[:3])
        fg = "white" if norm(a) < 0.6 else "black"
        tip = ", ".join(f"{k} {s[k]:.4f}" for k in ("alpha", *SIGNALS) if s.get(k) is not None)
        spans.append(
            f'<span style="background:{color};color:{fg};padding:2px 1px" '
            f'title="{html.escape(tip)}">{html.escape(s["token"])}</span>'
        )
    rows = "".join(
        "<tr>"
        + f"<td>{html.escape(s['token'])}</td>"
        + "".join(f"<td>{_f(s.get(k), 4)}</td>" for k in ("alpha", *SIGNALS))
        + "</tr>"
        for s in steps
    )
    page = (
        f"<!doctype html><meta charset='utf-8'><title>trace {html.escape(record['id'])}</title>"
        f"<body style='font-family:sans-serif'><h3>{html.escape(record['question'])}</h3>"
        f"<p>context answers: {html.escape(', '.join(record['context_answers']))}; memory answers: "
        f"{html.escape(', '.join(record['memory_answers']) or '–')}</p>"
        f"<p style='font-family:monospace;font-size:18px'>{''.join(spans)}</p>"
        "<table border=1 cellspacing=0 "
        f"cellpadding=3><tr><th>token</th><th>α</th><th>opposition</th><th>shift</th><th>noise</th></tr>{rows}</table></body>"
    )
    (out_dir / "trace.html").write_text(page, encoding="utf-8")
    return result


# -- all ---------------------------------------------------------------------------------------------


def run_analyses(run_dir: str | Path, *, method: str | None = None, example_id: str | None = None) -> dict[str, Any]:
    """All four analyses of a run folder, written to RUN_DIR/analysis/; returns their JSON."""
    records = load_run(run_dir)
    out = Path(run_dir) / ANALYSIS_DIR
    out.mkdir(parents=True, exist_ok=True)
    return {
        "token_selectivity": token_selectivity(records, out),
        "conflict_severity": conflict_severity(records, out),
        "non_conflict_control": non_conflict_control(records, out),
        "trace": example_trace(records, out, method=method, example_id=example_id),
    }
