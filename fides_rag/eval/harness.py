"""`fides-rag eval`: decode a dataset under several methods over one shared prefill, score, and compare.

Outputs in the run folder:
- predictions.jsonl: one line per example, appended and flushed after every batch, with every method's
  answer, scores and per-token alphas/signals. An interrupted run resumes: ids already complete in the
  file are skipped and a half-written last line is dropped.
- run.json: what was run (model, dataset and its files' SHA-256, methods and their options, settings); a resume
  must match it.
- results.json and results.md: metrics per method and paired-bootstrap comparisons.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fides_rag.eval.datasets import QAExample
from fides_rag.eval.metrics import METRIC_LABELS, METRICS, aggregate
from fides_rag.eval.parallel import barrier, gather, shard
from fides_rag.eval.records import read_predictions
from fides_rag.eval.shard_progress import ShardProgress
from fides_rag.eval.significance import paired_bootstrap
from fides_rag.eval.store import METHOD_OPTIONS, PREDICTIONS, RUN_INFO, PredictionStore, check_reuse
from fides_rag.eval.tables import markdown_table
from fides_rag.method.config import FidesConfig
from fides_rag.rules import ContrastRule, accepts_option, get_method

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
COMPARED_METRICS = ("cf", "em", "f1")
# What a resumed run must share with the run that wrote the file (and each kept method label its options).
_RESUME_KEYS = ("model", "dataset", "data_sha256", "max_new_tokens", "config", "strata")


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


def runnable_methods(
    names: Sequence[str], examples: Sequence[QAExample], *, skip: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The methods that can run on every example, and why the others cannot (DVD needs >= 2 documents).

    With skip=False (methods named explicitly) an unrunnable method is a ValueError, raised before any
    model is loaded; with skip=True (from --methods all) it is dropped and reported.
    """
    few = sum(1 for e in examples if len(e.contexts) < 2)
    runnable, skipped = [], {}
    for name in names:
        if few and get_method(name).needs_document_paths:
            why = (
                f"it needs at least 2 documents per example and {few} of the {len(examples)} examples have fewer "
                f"(use a multi-document dataset, e.g. the retrieval demo: fides-rag demo --methods {name})"
            )
            if not skip:
                raise ValueError(f"method {name!r} cannot run on this dataset: {why}")
            skipped[name] = why
        else:
            runnable.append(name)
    return runnable, skipped


def build_methods(
    names: Sequence[str], config: FidesConfig | None = None, ablations: bool = False
) -> dict[str, str | ContrastRule]:
    """label -> method for `generate_batch(methods=...)`: the named methods (those whose rule takes a `config` option
    are built with `config`), plus FIDES's ablations of `config`."""
    methods: dict[str, str | ContrastRule] = {}
    for name in names:
        methods[name] = (
            get_method(name, config=config) if config is not None and accepts_option(name, "config") else name
        )
    if ablations:
        methods.update(ablation_methods(config))
    return methods


def method_options(
    methods: Mapping[str, str | ContrastRule], decoder: FidesDecoder | None = None
) -> dict[str, dict[str, Any]]:
    """label -> the rule run for it (name and options; a name as `decoder` resolves it), as run.json records them."""
    described = {}
    for label, method in methods.items():
        rule = decoder.rule_for(method) if decoder is not None else get_method(method)
        described[label] = {"method": rule.name or type(rule).__name__, "options": rule.options()}
    return json.loads(json.dumps(described, sort_keys=True, default=str))


def _prompt_length(decoder: FidesDecoder, example: QAExample) -> int:
    text = "\n".join(example.contexts) + "\n" + example.question
    return len(decoder.tokenizer(text, add_special_tokens=False)["input_ids"])


def run_eval(
    decoder: FidesDecoder,
    examples: Sequence[QAExample],
    methods: Mapping[str, str | ContrastRule],
    out_dir: str | Path,
    *,
    batch_size: int = 8,
    max_new_tokens: int = 32,
    run_info: Mapping[str, Any] | None = None,
    progress: bool = True,
    bootstrap_samples: int = 1000,
    bootstrap_by: str = "question",
    seed: int = 0,
    parallel: tuple[int, int] = (0, 1),
) -> dict[str, Any]:
    """Decode `examples` under every method (one shared prefill per batch), append predictions, write results.

    Examples are batched in order of prompt length to limit padding. Methods an example already has in
    predictions.jsonl are not decoded again: rerunning an interrupted run finishes it, and rerunning a
    finished run with an extra method decodes only that method (the merged line replaces the old one).
    With `parallel=(rank, world)` (torchrun / accelerate launch) each process decodes every world-th example into
    its own shard folder, `shard-<rank>-of-<world>`, which resumes on its own; rank 0 then merges the shards and
    writes the results (the other ranks return an empty dict). Each rank shows its own progress; rank 0 also the total.
    The paired bootstrap resamples questions with all their rows (`bootstrap_by="question"`, the default: NQ-Swap
    repeats a question over several rows), or rows (`"row"`).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise ValueError("example ids must be unique (resuming relies on them)")
    labels = list(methods)
    if bootstrap_samples < 1:
        raise ValueError(f"bootstrap_samples must be >= 1, got {bootstrap_samples}")
    check_bootstrap_unit(bootstrap_by)
    info = _run_info(methods, run_info, max_new_tokens, batch_size, decoder)
    rank, world = parallel
    out = Path(out_dir)
    examples_all, examples = examples, (shard(examples, rank, world) if world > 1 else examples)
    store = PredictionStore(_folder(out, parallel), info, _RESUME_KEYS)
    started = time.perf_counter()
    todo = len(store.missing(examples, labels))
    shards = gather((todo, store.path.stat().st_size if store.path.is_file() else 0)) if world > 1 else [(todo, 0)]
    bar, total = _progress_bars(out, len(examples), todo, len(examples_all), shards, rank) if progress else (None, None)

    def on_batch(n: int) -> None:
        bar.update(n)  # type: ignore[union-attr]  # on_batch runs only with progress bars
        if total is not None:
            total.poll()

    try:
        store.decode(
            decoder,
            examples,
            methods,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            prompt_length=lambda e: _prompt_length(decoder, e),
            on_batch=on_batch if bar is not None else None,
        )
    finally:
        if bar is not None:
            bar.close()
    if world > 1:
        try:
            barrier(total.poll if total is not None else None)  # every shard is complete
        finally:
            if total is not None:
                total.close()
        if rank != 0:
            return {}
        records = _merged_shards(out, world, examples_all)
        info = {**info, "processes": world}
        (out / RUN_INFO).write_text(json.dumps(info, indent=2) + "\n")
    else:
        records = store.records_for(examples)
    elapsed, decoded = time.perf_counter() - started, sum(n for n, _ in shards)  # all processes together
    results = summarize(records, labels, bootstrap_samples=bootstrap_samples, bootstrap_by=bootstrap_by, seed=seed)
    results["run"] = {
        **info,
        "examples": len(records),
        "decoded_now": decoded,
        "seconds_now": round(elapsed, 2),
        "examples_per_second_now": round(decoded / elapsed, 3) if decoded and elapsed > 0 else None,
    }
    write_results(out, results)
    return results


def _run_info(
    methods: Mapping[str, str | ContrastRule],
    run_info: Mapping[str, Any] | None,
    max_new_tokens: int,
    batch_size: int,
    decoder: FidesDecoder | None = None,
) -> dict[str, Any]:
    return {
        **dict(run_info or {}),
        "methods": list(methods),
        "max_new_tokens": max_new_tokens,
        "batch_size": batch_size,
        METHOD_OPTIONS: method_options(methods, decoder),
    }


def _folder(out: Path, parallel: tuple[int, int]) -> Path:
    rank, world = parallel
    return out / f"shard-{rank}-of-{world}" if world > 1 else out


def check_resumable(
    out_dir: str | Path,
    methods: Mapping[str, str | ContrastRule],
    *,
    max_new_tokens: int,
    run_info: Mapping[str, Any] | None = None,
    parallel: tuple[int, int] = (0, 1),
) -> None:
    """What `run_eval` checks first, without a decoder (so before a model loads): refuse a run folder whose answers
    were decoded from other data, settings or method options, naming the fix."""
    check_reuse(_folder(Path(out_dir), parallel), _run_info(methods, run_info, max_new_tokens, 0), _RESUME_KEYS)


def _progress_bars(
    out: Path, shard_size: int, todo: int, total_size: int, shards: Sequence[tuple[int, int]], rank: int
) -> tuple[Any, ShardProgress | None]:
    """This process's bar; on rank 0 of several processes also the bar over every shard (from their (todo, file
    size))."""
    from tqdm.auto import tqdm

    world = len(shards)
    bar = tqdm(
        total=shard_size,
        initial=shard_size - todo,
        unit="ex",
        dynamic_ncols=True,
        position=rank,
        desc="eval" if world == 1 else f"eval rank {rank}/{world}",
    )
    if world == 1 or rank != 0:
        return bar, None
    files = [out / f"shard-{k}-of-{world}" / PREDICTIONS for k in range(world)]
    return bar, ShardProgress(
        files,
        [size for _, size in shards],
        total=total_size,
        initial=total_size - sum(n for n, _ in shards),
        position=world,
    )


def _merged_shards(out: Path, world: int, examples: Sequence[QAExample]) -> list[dict[str, Any]]:
    """The records of every shard folder, in the order of `examples`."""
    merged = {r["id"]: r for k in range(world) for r in read_predictions(out / f"shard-{k}-of-{world}" / PREDICTIONS)}
    return [merged[e.id] for e in examples if e.id in merged]


# -- results ---------------------------------------------------------------------------------------


BOOTSTRAP_UNITS = ("question", "row")
"""What the paired bootstrap resamples: questions (all the rows of a question together; the default), or rows."""


def check_bootstrap_unit(unit: str) -> str:
    if unit not in BOOTSTRAP_UNITS:
        raise ValueError(f"bootstrap_by must be one of {', '.join(BOOTSTRAP_UNITS)}, got {unit!r}")
    return unit


def summarize(
    records: Sequence[dict[str, Any]],
    labels: Sequence[str],
    *,
    bootstrap_samples: int = 1000,
    bootstrap_by: str = "question",
    seed: int = 0,
) -> dict[str, Any]:
    """Metrics per method (with the share of tokens contrasted and the mean answer length), and the paired bootstrap of
    every pair of methods on CF, EM and F1, resampling whole questions (default) or with bootstrap_by="row" rows."""
    check_bootstrap_unit(bootstrap_by)
    records = sorted(records, key=lambda r: r["id"])
    metrics: dict[str, Any] = {}
    for label in labels:
        outs = [r["outputs"][label] for r in records if label in r["outputs"]]
        summary = aggregate([o["scores"] for o in outs])
        alphas = [s["alpha"] for o in outs for s in o["steps"] if s.get("alpha") is not None]
        summary["mean_alpha"] = sum(alphas) / len(alphas) if alphas else None
        summary["mean_new_tokens"] = sum(o["new_tokens"] for o in outs) / len(outs) if outs else None
        summary["mean_answer_words"] = sum(len(o["text"].split()) for o in outs) / len(outs) if outs else None
        summary["share_contrasted"] = share_contrasted(outs)
        summary["n"] = len(outs)
        metrics[label] = summary
    comparisons = []
    for a, b in combinations(labels, 2):
        for metric in COMPARED_METRICS:
            scored = [
                r
                for r in records
                if a in r["outputs"] and b in r["outputs"] and r["outputs"][a]["scores"].get(metric) is not None
            ]
            if not scored:
                continue
            clusters = [r["question"] for r in scored] if bootstrap_by == "question" else None
            test = paired_bootstrap(
                [100 * r["outputs"][a]["scores"][metric] for r in scored],
                [100 * r["outputs"][b]["scores"][metric] for r in scored],
                samples=bootstrap_samples,
                seed=seed,
                clusters=clusters,
            )
            comparisons.append({"a": a, "b": b, "metric": metric, **test})
    return {"metrics": metrics, "significance": comparisons, "labels": list(labels), "bootstrap_by": bootstrap_by}


def share_contrasted(outputs: Sequence[Mapping[str, Any]]) -> float | None:
    """The share of generated tokens, in %, that a contrast rule chose: none under standard decoding, every token of
    an ungated contrast rule, and under a gate the tokens it left to the rule (its step's `gate` is 0)."""
    steps = [(o["method"], s) for o in outputs for s in o["steps"]]
    if not steps:
        return None
    return 100 * sum(1 for method, s in steps if method != "standard" and not s.get("gate")) / len(steps)


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
        lines.append(
            f"Model `{run.get('model')}`, dataset `{run.get('dataset')}`, {run.get('examples')} examples, "
            f"max_new_tokens {run.get('max_new_tokens')}.\n"
        )
    head = ["method", "n"] + [METRIC_LABELS[m] for m in METRICS] + ["mean α", "contrasted %", "tokens", "words"]
    rows = [
        [label, str(metrics[label]["n"])]
        + [_fmt(metrics[label][k]) for k in METRICS]
        + [
            _fmt(metrics[label]["mean_alpha"], 3),
            _fmt(metrics[label].get("share_contrasted")),
            _fmt(metrics[label]["mean_new_tokens"]),
            _fmt(metrics[label].get("mean_answer_words")),
        ]
        for label in labels
    ]
    lines += [markdown_table(head, rows), ""]
    lines.append(
        "CF = EM against the context answers on conflict-form samples; EM/F1 against the context answers; "
        "MemR = share of conflict-form predictions equal to the memory answer; Cont = a context answer is "
        "contained with at most 3 extra words; Acc = a context answer is contained in the output. All in %, "
        "SQuAD normalisation. Contrasted = share of answer tokens a contrast rule chose (a gate takes the "
        "others as a path gives them); tokens and words = mean answer length."
    )
    reference = "fides" if "fides" in labels else labels[0]
    compared = [c for c in results["significance"] if reference in (c["a"], c["b"])]
    if compared:
        by_question = results.get("bootstrap_by") == "question"
        unit = (
            f"of the {compared[0]['clusters']} questions (each with all its rows); p from flipping each question's sign"
            if by_question
            else "of the rows; p from a paired permutation test"
        )
        lines += [
            "",
            f"Paired bootstrap ({compared[0]['samples']} resamples {unit}, two-sided "
            f"{int(compared[0]['confidence'] * 100)}% CI), difference {reference} − other in points:",
            "",
        ]
        rows = []
        for c in compared:
            sign = 1 if c["a"] == reference else -1
            other = c["b"] if c["a"] == reference else c["a"]
            low, high = sorted((sign * c["ci_low"] + 0.0, sign * c["ci_high"] + 0.0))
            rows.append(
                [
                    f"{reference} vs {other}",
                    METRIC_LABELS[c["metric"]],
                    str(c["n"]),
                    f"{sign * c['diff'] + 0.0:+.1f}",
                    f"[{low:+.1f}, {high:+.1f}]",
                    f"{c['p_value']:.3f}",
                ]
            )
        lines.append(markdown_table(["comparison", "metric", "n", "diff", "95% CI", "p"], rows))
    return "\n".join(lines) + "\n"


def write_results(out_dir: str | Path, results: Mapping[str, Any]) -> None:
    out = Path(out_dir)
    (out / RESULTS_JSON).write_text(json.dumps(results, indent=2) + "\n")
    (out / RESULTS_MD).write_text(results_markdown(results))
