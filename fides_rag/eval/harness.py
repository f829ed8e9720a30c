"""`fides-rag eval`: decode a dataset under several methods over one shared prefill, score, and compare.

Outputs in the run folder:
- predictions.jsonl: one line per example, appended and flushed after every batch, with every method's
  answer, scores and per-token alphas/signals. An interrupted run resumes: ids already complete in the
  file are skipped and a half-written last line is dropped.
- run.json: what was run (model, dataset, methods, settings); a resume must match it.
- results.json and results.md: metrics per method and paired-bootstrap comparisons.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

from fides_rag.config import FidesConfig
from fides_rag.eval.datasets import QAExample
from fides_rag.eval.metrics import METRIC_LABELS, METRICS, aggregate, score_prediction
from fides_rag.eval.significance import paired_bootstrap
from fides_rag.eval.tables import markdown_table
from fides_rag.result import GenerationResult
from fides_rag.rules import ContrastRule, get_method

PREDICTIONS = "predictions.jsonl"
RUN_INFO = "run.json"
RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
COMPARED_METRICS = ("cf", "em", "f1")
_SIGNAL_FIELDS = ("alpha", "opposition", "shift", "noise", "score")
# What a resumed run must share with the run that wrote the file.
_RESUME_KEYS = ("model", "dataset", "data", "max_new_tokens", "config")


def ablation_methods(config: FidesConfig | None = None) -> dict[str, ContrastRule]:
    """The source's ablations from one config: each signal removed, Opposition only, fixed a = 1.0."""
    config = config or FidesConfig()
    methods: dict[str, ContrastRule] = {}
    for signal in config.active_signals:
        if len(config.active_signals) > 1:
            methods[f"fides-no-{signal}"] = get_method("fides", config=config.without(signal))
    methods["fides-opposition-only"] = get_method("fides", config=config.with_signals("opposition"))
    methods["fides-fixed-alpha-1.0"] = get_method("fides", config=config.with_fixed_alpha(1.0))
    return methods


def runnable_methods(names: Sequence[str], examples: Sequence[QAExample], *, skip: bool = False) -> tuple[list[str], dict[str, str]]:
    """The methods that can run on every example, and why the others cannot (DVD needs >= 2 documents).

    With skip=False (methods named explicitly) an unrunnable method is a ValueError, raised before any
    model is loaded; with skip=True (from --methods all) it is dropped and reported.
    """
    few = sum(1 for e in examples if len(e.contexts) < 2)
    runnable, skipped = [], {}
    for name in names:
        if few and get_method(name).needs_document_paths:
            why = (f"it needs at least 2 documents per example and {few} of the {len(examples)} examples have fewer "
                   f"(use a multi-document dataset, e.g. the retrieval demo: fides-rag demo --methods {name})")
            if not skip:
                raise ValueError(f"method {name!r} cannot run on this dataset: {why}")
            skipped[name] = why
        else:
            runnable.append(name)
    return runnable, skipped


def build_methods(names: Sequence[str], config: FidesConfig | None = None, ablations: bool = False) -> dict[str, str | ContrastRule]:
    """label -> method for `generate_methods`: the named methods ("fides" uses `config`), plus the ablations."""
    config = config or FidesConfig()
    methods: dict[str, str | ContrastRule] = {}
    for name in names:
        methods[name] = get_method("fides", config=config) if name == "fides" else name
    if ablations:
        methods.update(ablation_methods(config))
    return methods


def _round(value: float | None, digits: int = 5) -> float | None:
    if value is None or not math.isfinite(value):
        return value
    return round(float(value), digits)


def trim_result(result: GenerationResult) -> dict[str, Any]:
    """A GenerationResult without its prompts, with compact per-token records (None fields dropped)."""
    steps = []
    for s in result.steps:
        step: dict[str, Any] = {"token": s.token, "token_id": s.token_id}
        for name in _SIGNAL_FIELDS:
            value = getattr(s, name)
            if value is not None:
                step[name] = _round(value)
        steps.append(step)
    alphas = [s.alpha for s in result.steps if s.alpha is not None]
    return {
        "text": result.text,
        "method": result.method,
        "requested_method": result.requested_method,
        "finish_reason": result.finish_reason,
        "prompt_tokens": result.prompt_tokens,
        "new_tokens": len(result.token_ids),
        "notes": list(result.notes),
        "documents_trimmed": result.documents_trimmed,
        "mean_alpha": _round(sum(alphas) / len(alphas)) if alphas else None,
        "steps": steps,
    }


def example_record(example: QAExample, outputs: Mapping[str, GenerationResult]) -> dict[str, Any]:
    """One predictions.jsonl line: the example's answers and, per method label, its trimmed result and scores."""
    methods = {}
    for label, result in outputs.items():
        entry = trim_result(result)
        entry["scores"] = score_prediction(result.text, example.context_answers, example.memory_answers)
        methods[label] = entry
    return {
        "id": example.id,
        "question": example.question,
        "context_answers": list(example.context_answers),
        "memory_answers": list(example.memory_answers),
        "conflict": example.is_conflict,
        "form": example.meta.get("form", "conflict" if example.is_conflict else "original"),
        "outputs": methods,
    }


# -- the predictions file ------------------------------------------------------------------------


def read_predictions(path: str | Path, repair: bool = False) -> list[dict[str, Any]]:
    """Every complete record of a predictions file (a later record of the same id replaces an earlier one).

    A line that is not valid JSON can only be a half-written last line of an interrupted run: it is
    skipped, and with repair=True cut from the file so that appends start on a fresh line.
    A bad line anywhere else is an error naming the line.
    """
    path = Path(path)
    if not path.is_file():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records: dict[str, dict[str, Any]] = {}
    keep = 0  # bytes up to and including the newline of the last good line
    offset = 0
    for number, line in enumerate(lines, start=1):
        offset_next = offset + len(line) + 1
        if line.strip():
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or "id" not in record:
                    raise ValueError("not a prediction record")
            except ValueError as err:
                if any(rest.strip() for rest in lines[number:]):
                    raise ValueError(f"{path}, line {number}: not a valid prediction record ({err})") from None
                break  # half-written last line
            records[str(record["id"])] = record
            keep = offset_next
        offset = offset_next
    if repair:
        if keep > len(raw):  # the last good line lacks its newline
            with path.open("ab") as handle:
                handle.write(b"\n")
        elif raw[keep:].strip():
            with path.open("r+b") as handle:
                handle.truncate(keep)
    return list(records.values())


def _prompt_length(decoder: Any, example: QAExample) -> int:
    text = "\n".join(example.contexts) + "\n" + example.question
    return len(decoder.tokenizer(text, add_special_tokens=False)["input_ids"])


def check_resume(info_path: Path, info: Mapping[str, Any], keys: Sequence[str], *, what: str = "a run", fix: str = "") -> None:
    """Refuse to resume a run folder whose recorded `info_path` differs from `info` on any of `keys`
    (answers decoded under other settings would not be this run's); the error names each change and the fix."""
    if not info_path.is_file():
        return
    old = json.loads(info_path.read_text(encoding="utf-8"))
    changed = [k for k in keys if old.get(k) != info.get(k)]
    if changed:
        raise ValueError(
            f"{info_path.parent} holds {what} with different {', '.join(changed)} "
            f"({'; '.join(f'{k}: {old.get(k)!r} -> {info.get(k)!r}' for k in changed)}); use a new --out folder{fix}"
        )


def run_eval(
    decoder: Any,
    examples: Sequence[QAExample],
    methods: Mapping[str, str | ContrastRule],
    out_dir: str | Path,
    *,
    batch_size: int = 8,
    max_new_tokens: int = 32,
    run_info: Mapping[str, Any] | None = None,
    progress: bool = True,
    bootstrap_samples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Decode `examples` under every method (one shared prefill per batch), append predictions, write results.

    Examples are batched in order of prompt length to limit padding. Methods an example already has in
    predictions.jsonl are not decoded again: rerunning an interrupted run finishes it, and rerunning a
    finished run with an extra method decodes only that method (the merged line replaces the old one).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise ValueError("example ids must be unique (resuming relies on them)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    labels = list(methods)
    info = {**dict(run_info or {}), "methods": labels, "max_new_tokens": max_new_tokens, "batch_size": batch_size}
    check_resume(out / RUN_INFO, info, _RESUME_KEYS)
    (out / RUN_INFO).write_text(json.dumps(info, indent=2) + "\n")

    pred_path = out / PREDICTIONS
    existing = {r["id"]: r for r in read_predictions(pred_path, repair=True)}
    # Per example, the methods it still lacks: a resumed run decodes only those (a new method added to a
    # finished run costs that method alone), and the merged record replaces the old line.
    missing = {e.id: [l for l in labels if l not in existing.get(e.id, {}).get("outputs", {})] for e in examples}
    todo = [e for e in examples if missing[e.id]]
    todo.sort(key=lambda e: (tuple(missing[e.id]) != tuple(labels), _prompt_length(decoder, e)))
    started = time.perf_counter()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(examples), initial=len(examples) - len(todo), unit="ex", desc="eval", dynamic_ncols=True)
    try:
        with pred_path.open("a", encoding="utf-8") as handle:
            for group_labels in dict.fromkeys(tuple(missing[e.id]) for e in todo):
                group = [e for e in todo if tuple(missing[e.id]) == group_labels]
                group_methods = {label: methods[label] for label in group_labels}
                for start in range(0, len(group), batch_size):
                    batch = group[start : start + batch_size]
                    outputs = decoder.generate_methods(
                        [e.question for e in batch], [list(e.contexts) for e in batch], group_methods,
                        max_new_tokens=max_new_tokens,
                    )
                    for i, example in enumerate(batch):
                        record = example_record(example, {label: outputs[label][i] for label in group_labels})
                        record["outputs"] = {**existing.get(example.id, {}).get("outputs", {}), **record["outputs"]}
                        handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                    handle.flush()
                    if bar is not None:
                        bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    elapsed = time.perf_counter() - started

    wanted = set(ids)
    records = [r for r in read_predictions(pred_path) if r["id"] in wanted]
    results = summarize(records, labels, bootstrap_samples=bootstrap_samples, seed=seed)
    results["run"] = {**info, "examples": len(records), "decoded_now": len(todo), "seconds_now": round(elapsed, 2),
                      "examples_per_second_now": round(len(todo) / elapsed, 3) if todo and elapsed > 0 else None}
    write_results(out, results)
    return results


# -- results ---------------------------------------------------------------------------------------


def summarize(records: Sequence[dict[str, Any]], labels: Sequence[str], *, bootstrap_samples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Metrics per method, and the paired bootstrap of every pair of methods on CF, EM and F1."""
    records = sorted(records, key=lambda r: r["id"])
    metrics: dict[str, Any] = {}
    for label in labels:
        outs = [r["outputs"][label] for r in records if label in r["outputs"]]
        summary = aggregate([o["scores"] for o in outs])
        alphas = [s["alpha"] for o in outs for s in o["steps"] if s.get("alpha") is not None]
        summary["mean_alpha"] = sum(alphas) / len(alphas) if alphas else None
        summary["mean_new_tokens"] = sum(o["new_tokens"] for o in outs) / len(outs) if outs else None
        summary["n"] = len(outs)
        metrics[label] = summary
    comparisons = []
    for a, b in combinations(labels, 2):
        for metric in COMPARED_METRICS:
            pairs = [
                (r["outputs"][a]["scores"][metric], r["outputs"][b]["scores"][metric])
                for r in records
                if a in r["outputs"] and b in r["outputs"] and r["outputs"][a]["scores"].get(metric) is not None
            ]
            if not pairs:
                continue
            test = paired_bootstrap([100 * x for x, _ in pairs], [100 * y for _, y in pairs], samples=bootstrap_samples, seed=seed)
            comparisons.append({"a": a, "b": b, "metric": metric, **test})
    return {"metrics": metrics, "significance": comparisons, "labels": list(labels)}


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def results_markdown(results: Mapping[str, Any]) -> str:
    """The metrics table, then the paired-bootstrap comparisons of FIDES (or the first method) with the others."""
    labels = results["labels"]
    metrics = results["metrics"]
    run = results.get("run", {})
    lines = []
    if run:
        lines.append(f"Model `{run.get('model')}`, dataset `{run.get('dataset')}`, {run.get('examples')} examples, "
                     f"max_new_tokens {run.get('max_new_tokens')}.\n")
    head = ["method", "n"] + [METRIC_LABELS[m] for m in METRICS] + ["mean α", "tokens"]
    rows = [[label, str(metrics[label]["n"])] + [_fmt(metrics[label][k]) for k in METRICS]
            + [_fmt(metrics[label]["mean_alpha"], 3), _fmt(metrics[label]["mean_new_tokens"])] for label in labels]
    lines += [markdown_table(head, rows), ""]
    lines.append("CF = EM against the context answers on conflict-form samples; EM/F1 against the context answers; "
                 "MemR = share of conflict-form predictions equal to the memory answer; Acc = a context answer is "
                 "contained in the output. All in %, SQuAD normalisation.")
    reference = "fides" if "fides" in labels else labels[0]
    compared = [c for c in results["significance"] if reference in (c["a"], c["b"])]
    if compared:
        lines += ["", f"Paired bootstrap ({compared[0]['samples']} resamples, two-sided {int(compared[0]['confidence'] * 100)}% CI; "
                  f"p from a paired permutation test), difference {reference} − other in points:", ""]
        rows = []
        for c in compared:
            sign = 1 if c["a"] == reference else -1
            other = c["b"] if c["a"] == reference else c["a"]
            low, high = sorted((sign * c["ci_low"] + 0.0, sign * c["ci_high"] + 0.0))
            rows.append([f"{reference} vs {other}", METRIC_LABELS[c["metric"]], str(c["n"]), f"{sign * c['diff'] + 0.0:+.1f}",
                         f"[{low:+.1f}, {high:+.1f}]", f"{c['p_value']:.3f}"])
        lines.append(markdown_table(["comparison", "metric", "n", "diff", "95% CI", "p"], rows))
    return "\n".join(lines) + "\n"


def write_results(out_dir: str | Path, results: Mapping[str, Any]) -> None:
    out = Path(out_dir)
    (out / RESULTS_JSON).write_text(json.dumps(results, indent=2) + "\n")
    (out / RESULTS_MD).write_text(results_markdown(results))
