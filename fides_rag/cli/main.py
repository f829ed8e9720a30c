"""The `fides-rag` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from fides_rag.cli.models_command import add_models_parser, run_models_command
from fides_rag.decoder import MIN_BATCHED_TOKENS, FidesDecoder
from fides_rag.demo.cli import add_demo_parser, run_demo_command
from fides_rag.errors import MissingExtraError
from fides_rag.eval.datasets import DATASETS
from fides_rag.extras import check_extra
from fides_rag.method.config import FidesConfig
from fides_rag.models.options import add_model_arguments, load_options
from fides_rag.report import step_table
from fides_rag.rules import available_gates, available_methods, get_method, parse_method_names
from fides_rag.serve.command import add_serve_parser, run_serve_command

DEFAULT_MODEL = "gemma3-270m"
DATASET_NAMES = f"{', '.join(DATASETS[:-1])} or {DATASETS[-1]}"
"""The datasets --dataset takes, in words."""


class MethodList(list):
    """Parsed --methods: the names, and whether they came from 'all' (which skips methods a dataset cannot run)."""

    from_all: bool = False


def _methods(value: str) -> MethodList:
    try:
        methods = MethodList(parse_method_names(value))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    methods.from_all = "all" in [m.strip() for m in value.split(",")]
    return methods


def _labelled_config(value: str) -> tuple[str, FidesConfig]:
    label, sep, path = value.partition("=")
    if not sep or not label.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"expected LABEL=FILE (e.g. calibrated=cal.json), got {value!r}")
    try:
        return label.strip(), FidesConfig.from_file(path.strip())
    except (OSError, ValueError) as err:
        raise argparse.ArgumentTypeError(f"cannot read the FidesConfig in {path.strip()!r}: {err}") from None


def _integer_at_least(minimum: int):
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {number}")
        return number

    return parse


def _per_stratum(value: str) -> int | dict[str, int | None]:
    from fides_rag.eval.strata import parse_per_stratum

    try:
        return parse_per_stratum(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument reported on one line that names it (and where the usage is), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _non_empty_text(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must be a non-empty question")
    return value


MAX_LOAD = 100.0
"""The largest serving load, as a multiple of the sequential capacity."""


def _loads(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--serving-loads must be comma-separated numbers, e.g. 0.5,1,2; got {text!r}") from None
    if not loads or any(not 0 < x <= MAX_LOAD for x in loads):
        raise ValueError(f"--serving-loads must be numbers in (0, 100], got {text!r}")
    return loads


def _budgets(text: str) -> list[int]:
    hint = f"must be comma-separated integers >= {MIN_BATCHED_TOKENS}, e.g. 128,256,512; got {text!r}"
    try:
        budgets = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(hint) from None
    if not budgets or min(budgets) < MIN_BATCHED_TOKENS:
        raise argparse.ArgumentTypeError(hint)
    return budgets


def _load(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < value <= MAX_LOAD:
        raise argparse.ArgumentTypeError(f"must be in (0, {MAX_LOAD:g}], got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fides-rag", description="Faithful RAG decoding with FIDES and its baselines.")
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("methods", help="list the decoding methods and the gates that compose with them")

    generate = commands.add_parser("generate", help="answer one question from documents with one or more methods")
    generate.add_argument("question", type=_non_empty_text)
    generate.add_argument("--doc", action="append", default=[], help="a document (repeat for several)")
    generate.add_argument("--model", default=DEFAULT_MODEL, help="bundled alias, hub id, local folder or .gguf file")
    generate.add_argument(
        "--methods", type=_methods, default=["fides"], help="comma-separated, e.g. standard,cad,fides"
    )
    generate.add_argument("--config", help="a FidesConfig JSON file (e.g. from calibration)")
    generate.add_argument("--max-new-tokens", type=_integer_at_least(1), default=32)
    add_model_arguments(generate)
    generate.add_argument("--steps", action="store_true", help="print the per-token alpha and signal table")
    generate.add_argument("--json", action="store_true", help="print results as JSON lines")
    add_demo_parser(commands)
    add_serve_parser(commands, DEFAULT_MODEL)
    add_models_parser(commands)

    bench = commands.add_parser("bench", help="latency, time split, context growth and throughput, side by side")
    bench.add_argument("--models", default="gemma3-270m,smollm2-135m-instruct", help="comma-separated models")
    bench.add_argument(
        "--sections",
        default="latency,split,context,throughput",
        help="comma-separated: latency, raw (raw prompts, short no-context prompt), split, context, throughput, "
        "serving (64 FIDES requests of 8-64 tokens, Poisson arrivals at 0.5x, 1x, 2x the sequential capacity: "
        "continuous vs static batching vs sequential), budget (continuous serving of --serving-requests at "
        "--budget-load under each of --budgets)",
    )
    bench.add_argument("--data", help="NQ-Swap parquet/jsonl (default: $FIDES_RAG_DATA or ../shared/data)")
    bench.add_argument(
        "--samples", type=int, default=20, help="prompts timed per method in latency and raw (default 20)"
    )
    bench.add_argument("--warmup", type=int, default=3, help="untimed prompts first (default 3)")
    bench.add_argument(
        "--new-tokens", type=int, default=64, help="tokens forced per timed decode in latency and raw (default 64)"
    )
    bench.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, ...")
    bench.add_argument(
        "--mode", choices=["exact", "fast"], help="the engine's mode (default: exact on the CPU, fast elsewhere)"
    )
    bench.add_argument(
        "--serving-requests", type=_integer_at_least(2), default=64, help="requests per load in serving (default 64)"
    )
    bench.add_argument(
        "--serving-loads",
        default="0.5,1,2",
        help="loads of serving, as multiples of the sequential capacity (default 0.5,1,2)",
    )
    bench.add_argument(
        "--max-num-batched-tokens",
        type=_integer_at_least(1),
        default=None,
        help="serving: tokens a step computes (its decodes, then prefill chunks); default the engine's for the device",
    )
    bench.add_argument(
        "--budgets",
        type=_budgets,
        default=[64, 128, 256, 512, 1024],
        help="budget: the max_num_batched_tokens swept, comma-separated (default 64,128,256,512,1024)",
    )
    bench.add_argument(
        "--budget-load",
        type=_load,
        default=1.0,
        help="budget: the load, as a multiple of the sequential capacity (default 1)",
    )
    bench.add_argument("--out", default="runs/bench.json", help="JSON report, rewritten after every section")
    evaluate = commands.add_parser(
        "eval", help="score methods on a QA dataset (CF, EM, F1, memorisation, accuracy) with significance"
    )
    evaluate.add_argument("--model", default=DEFAULT_MODEL, help="bundled alias, hub id, local folder or .gguf file")
    evaluate.add_argument("--dataset", default="nq-swap", help=DATASET_NAMES)
    evaluate.add_argument(
        "--data", help="dataset file (or pminervini/NQ-Swap); default: $FIDES_RAG_DATA or ../shared/data"
    )
    evaluate.add_argument("--passages", help="PopQA passages file (default: beside --data)")
    evaluate.add_argument(
        "--mode",
        choices=["exact", "fast"],
        help="the engine's mode: exact (each answer as if decoded alone) or fast (default: exact on the CPU, fast "
        "elsewhere)",
    )
    evaluate.add_argument(
        "--methods",
        type=_methods,
        default=["standard", "cad", "adacad", "fides"],
        help="comma-separated, or all (every registered method the dataset can run)",
    )
    evaluate.add_argument("--limit", type=_integer_at_least(1), help="first N examples")
    evaluate.add_argument("--out", required=True, help="run folder (rerun with the same folder to resume)")
    evaluate.add_argument("--batch-size", type=_integer_at_least(1), default=8)
    evaluate.add_argument("--config", help="a FidesConfig JSON file (used by fides and the ablations)")
    evaluate.add_argument(
        "--ablations", action="store_true", help="add FIDES without each signal, opposition only, fixed alpha 1.0"
    )
    evaluate.add_argument(
        "--fides-config",
        action="append",
        default=[],
        type=_labelled_config,
        metavar="LABEL=FILE",
        help="add FIDES with another FidesConfig as method 'fides-LABEL' (repeatable), e.g. calibrated=cal.json",
    )
    evaluate.add_argument("--max-new-tokens", type=_integer_at_least(1), default=32)
    evaluate.add_argument("--bootstrap", type=_integer_at_least(1), default=1000, help="paired bootstrap resamples")
    evaluate.add_argument(
        "--bootstrap-by",
        choices=["question", "row"],
        default="question",
        help="what the paired bootstrap resamples: questions with all their rows (the default: NQ-Swap "
        "repeats a question over several rows), or rows",
    )
    evaluate.add_argument(
        "--strata",
        action="store_true",
        help="answer each distinct question closed-book first and split the results into true_conflict, "
        "supplied, known_agreeing and unknown_agreeing, each method against standard (needs each "
        "row's original answer)",
    )
    evaluate.add_argument(
        "--per-stratum",
        type=_per_stratum,
        metavar="N|STRATUM=N,...",
        help="with --strata: score the first N rows of each stratum of a seeded shuffle (default every row), or "
        "a count per stratum, a bare N for the strata not named, e.g. 50,true_conflict=300,known_agreeing=300",
    )
    evaluate.add_argument(
        "--strata-seed", type=int, default=0, help="with --strata: the seed of that shuffle (default 0)"
    )
    add_model_arguments(evaluate)
    evaluate.add_argument("--analyze", action="store_true", help="run the analyses on the finished run")
    evaluate.add_argument("--no-progress", action="store_true")
    calibrate = commands.add_parser(
        "calibrate",
        help="label-free calibration of FIDES's scales and weights, or of a gate's threshold, for a backbone (writes "
        "a FidesConfig JSON)",
    )
    calibrate.add_argument("--model", required=True, help="bundled alias, hub id, local folder or .gguf file")
    calibrate.add_argument(
        "--dataset",
        default="nq-swap",
        help=f"{DATASET_NAMES} (answers are never read)",
    )
    calibrate.add_argument("--data", help="dataset file; default: $FIDES_RAG_DATA or ../shared/data")
    calibrate.add_argument("--passages", help="PopQA passages file (default: beside --data)")
    calibrate.add_argument("--n", type=_integer_at_least(2), required=True, help="number of unlabelled prompts (>= 2)")
    calibrate.add_argument(
        "--offset",
        type=_integer_at_least(0),
        default=0,
        help="skip the first K examples (keep the pool apart from an eval on the first ones)",
    )
    calibrate.add_argument(
        "--gate",
        help="fit this gate's threshold instead of FIDES's scales (evidence: tau; blend: kappa), so that the rule "
        "acts on --target-share of the tokens",
    )
    calibrate.add_argument(
        "--target-share",
        type=float,
        default=None,
        help="with --gate: the share of tokens the rule acts on, strictly between 0 and 1 (default 0.1)",
    )
    calibrate.add_argument(
        "--config", help="with --gate: the FidesConfig JSON to add the gate's threshold to (default: the defaults)"
    )
    calibrate.add_argument("--batch-size", type=_integer_at_least(1), default=8)
    calibrate.add_argument("--max-new-tokens", type=_integer_at_least(1), default=16)
    calibrate.add_argument(
        "--out", default="calibrated.json", help="the calibrated FidesConfig; the statistics table goes beside it (.md)"
    )
    add_model_arguments(calibrate)
    calibrate.add_argument("--no-progress", action="store_true")
    analyze = commands.add_parser(
        "analyze", help="token selectivity, conflict severity, non-conflict control and a trace of a run"
    )
    analyze.add_argument("run_dir")
    analyze.add_argument("--method", help="method of the trace (default fides)")
    analyze.add_argument(
        "--example", help="example id of the trace (default: the first conflict answer with answer tokens)"
    )
    return parser


# Sub-commands that need an optional extra, checked before any work so that a missing one is a one-line message.
_EXTRA_OF_COMMAND = {"eval": "eval", "analyze": "eval", "demo": "demo", "serve": "serve"}
# Sub-commands whose bad input (a file, a model, a device, a value) is a one-line error with exit code 2.
_ONE_LINE_ERRORS = ("generate", "eval", "calibrate", "analyze", "bench", "serve")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `fides-rag` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.command in _EXTRA_OF_COMMAND:
            check_extra(_EXTRA_OF_COMMAND[args.command], command=args.command)
        return _dispatch(args)
    except MissingExtraError as err:
        print(f"fides-rag {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (ValueError, OSError, ImportError) as err:
        if args.command not in _ONE_LINE_ERRORS:
            raise
        print(f"fides-rag {args.command}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "methods":
        print("\n".join(available_methods()))
        print(f"gates (spell a gated method rule+gate, e.g. fides+agree): {', '.join(available_gates())}")
        return 0
    if args.command == "demo":
        return run_demo_command(args)
    if args.command == "models":
        return run_models_command(args)
    if args.command == "serve":
        return run_serve_command(args)
    if args.command == "bench":
        from fides_rag.eval.bench import run_bench

        run_bench(
            [m for m in args.models.split(",") if m],
            [s for s in args.sections.split(",") if s],
            data=args.data,
            samples=args.samples,
            warmup=args.warmup,
            new_tokens=args.new_tokens,
            device=args.device,
            out=args.out,
            mode=args.mode,
            serving={
                "n_requests": args.serving_requests,
                "loads": _loads(args.serving_loads),
                "max_num_batched_tokens": args.max_num_batched_tokens,
            },
            budget={"budgets": args.budgets, "load": args.budget_load, "n_requests": args.serving_requests},
        )
        print(f"\nJSON report: {args.out}")
        return 0
    if args.command in ("eval", "calibrate"):  # long runs: bad input is a one-line error (see main), before any work
        try:
            return (_eval if args.command == "eval" else _calibrate)(args)
        except KeyboardInterrupt:
            if args.command == "eval":
                print(
                    f"\nfides-rag eval: interrupted; the answers so far are in {args.out}; rerun the same command "
                    "to resume",
                    file=sys.stderr,
                )
                return 130
            raise
    if args.command == "analyze":
        return _analyze(args.run_dir, args.method, args.example)
    config = FidesConfig.from_file(args.config) if args.config else FidesConfig()
    decoder = FidesDecoder.from_pretrained(args.model, config=config, **load_options(args))
    for method in args.methods:
        result = decoder.generate(args.question, args.doc, method=method, max_new_tokens=args.max_new_tokens)
        if args.json:
            print(json.dumps(result.to_dict()))
            continue
        print(f"{method:>8}: {result.text}")
        for note in result.notes:
            print(f"{'':>10}note: {note}")
        if args.steps:
            print(step_table(result), end="\n\n")
    return 0


def _analyze(run_dir: str, method: str | None = None, example: str | None = None) -> int:
    from fides_rag.eval.analysis import ANALYSIS_DIR, run_analyses

    report = run_analyses(run_dir, method=method, example_id=example)
    for label, sel in report["token_selectivity"]["methods"].items():
        means = ", ".join(f"{c} {v:.3f}" for c, v in sel["mean_alpha"].items() if v is not None)
        auroc = sel["auroc_answer_vs_rest"]
        print(f"selectivity {label}: {means}; AUROC {'–' if auroc is None else f'{auroc:.3f}'}")
    print(f"analyses written to {run_dir}/{ANALYSIS_DIR}/")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from fides_rag.eval.datasets import dataset_files, load_examples
    from fides_rag.eval.harness import RESULTS_MD, build_methods, check_resumable, run_eval, runnable_methods
    from fides_rag.eval.parallel import local_device, process_group
    from fides_rag.eval.store import files_sha256, make_run_folder

    config = FidesConfig.from_file(args.config) if args.config else FidesConfig()
    examples = load_examples(args.dataset, args.data, limit=args.limit, passages=args.passages)
    names, skipped = runnable_methods(args.methods, examples, skip=getattr(args.methods, "from_all", False))
    for name, why in skipped.items():
        print(f"--methods all: skipping {name}: {why}", file=sys.stderr)
    methods = build_methods(names, config, ablations=args.ablations)
    variants = {}
    for label, variant in args.fides_config:
        if f"fides-{label}" in methods:
            raise ValueError(
                f"--fides-config label {label!r} clashes with the method 'fides-{label}'; pick another label"
            )
        methods[f"fides-{label}"] = get_method("fides", config=variant)
        variants[f"fides-{label}"] = variant.to_dict()
    files = dataset_files(
        args.dataset, args.data, passages=args.passages
    )  # a resume must be made from the same content
    info = {
        "model": args.model,
        "dataset": args.dataset,
        "data": args.data,
        "data_files": [str(f) for f in files],
        "data_sha256": files_sha256(files) if files else f"hub:{args.data}",
        "config": config.without_gates().to_dict(),  # gate options are recorded with each gated method's options
    }
    if args.mode is not None:
        info["mode"] = args.mode
    if variants:
        info["fides_variants"] = variants
    if skipped:
        info["skipped_methods"] = skipped
    options = load_options(args)
    rank, world = process_group()  # several under torchrun / accelerate launch: each decodes its shard
    if world > 1 and "device_map" in options:
        raise ValueError(
            f"--device-map splits one model over this process's devices, but {world} processes were launched, "
            "each loading its own copy: drop --device-map (each process takes its own GPU) or run one process"
        )
    make_run_folder(args.out)  # before the model loads: a bad --out, or another run's answers in it, fail at once
    if args.strata:
        from fides_rag.eval.strata_run import check_strata_run, run_strata_eval, strata_settings

        check_strata_run(examples, list(methods), args.out, world=world)
        info["strata"] = strata_settings(args.per_stratum, args.strata_seed)
    elif args.per_stratum is not None:
        raise ValueError("--per-stratum selects rows per stratum and needs --strata")
    check_resumable(args.out, methods, max_new_tokens=args.max_new_tokens, run_info=info, parallel=(rank, world))
    decoder = FidesDecoder.from_pretrained(
        args.model, config=config, mode=args.mode, **{**options, "device": local_device(args.device)}
    )
    if args.strata:
        run_strata_eval(
            decoder,
            examples,
            methods,
            args.out,
            model=args.model,
            dataset=args.dataset,
            per_stratum=args.per_stratum,
            seed=args.strata_seed,
            batch_size=args.batch_size,
            max_new_tokens=args.max_new_tokens,
            run_info={k: v for k, v in info.items() if k != "strata"},
            progress=not args.no_progress,
            bootstrap_samples=args.bootstrap,
            bootstrap_by=args.bootstrap_by,
        )
    else:
        run_eval(
            decoder,
            examples,
            methods,
            args.out,
            batch_size=args.batch_size,
            max_new_tokens=args.max_new_tokens,
            run_info=info,
            progress=not args.no_progress,
            bootstrap_samples=args.bootstrap,
            bootstrap_by=args.bootstrap_by,
            parallel=(rank, world),
        )
    if rank != 0:
        return 0
    print((Path(args.out) / RESULTS_MD).read_text())
    if args.analyze:
        _analyze(args.out)
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    """Decode an unlabelled pool (questions and documents only), write the calibrated config and its statistics."""
    from fides_rag.eval.calibration import calibrate, check_writable, write_report
    from fides_rag.eval.datasets import data_dir, load_examples
    from fides_rag.eval.gate_calibration import DEFAULT_TARGET_SHARE, check_target_share, thresholded_gate

    if args.gate is None and (args.target_share is not None or args.config is not None):
        raise ValueError("--target-share and --config go with --gate (the gate whose threshold to fit)")
    if args.gate is not None:  # bad input before any work
        thresholded_gate(args.gate)
        check_target_share(DEFAULT_TARGET_SHARE if args.target_share is None else args.target_share)
    base = FidesConfig.from_file(args.config) if args.config else None
    check_writable(args.out)
    examples = load_examples(args.dataset, args.data, limit=args.offset + args.n, passages=args.passages)
    available = len(examples)
    examples = examples[args.offset :]
    if not examples:
        raise ValueError(
            f"empty calibration pool: {args.dataset} has {available} examples and --offset {args.offset} skips them all"
        )
    if len(examples) < 2:
        raise ValueError(
            f"calibration needs at least 2 prompts; only {len(examples)} remain after --offset {args.offset}"
        )
    if len(examples) < args.n:
        print(
            f"note: only {len(examples)} examples after --offset {args.offset}; calibrating on {len(examples)}, "
            f"not {args.n}",
            file=sys.stderr,
        )
    pairs = [(e.question, list(e.contexts)) for e in examples]  # answers are never read
    decoder = FidesDecoder.from_pretrained(args.model, **load_options(args))
    source = {
        "model": args.model,
        "dataset": args.dataset,
        "data": args.data if args.data is not None else f"default under {data_dir()}",
        "n": args.n,
        "offset": args.offset,
        "first_id": examples[0].id,
        "last_id": examples[-1].id,
        "seed": None,
        "sampling": "greedy (nothing random: the pool is examples offset..offset+n-1 in file order)",
        "device": str(decoder.device),
        "dtype": str(decoder.model.dtype),
    }
    if args.gate is not None:
        return _calibrate_gate(args, decoder, pairs, base, source)
    report = calibrate(
        decoder,
        pairs,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        progress=not args.no_progress,
        source=source,
    )
    config_path, md_path = write_report(report, args.out)
    print(report.markdown())
    print(f"calibrated config: {config_path} (use with --config {config_path}); statistics: {md_path}")
    return 0


def _calibrate_gate(
    args: argparse.Namespace, decoder: FidesDecoder, pairs: list[Any], base: FidesConfig | None, source: dict
) -> int:
    from fides_rag.eval.gate_calibration import DEFAULT_TARGET_SHARE, calibrate_gate, write_gate_calibration

    calibration = calibrate_gate(
        decoder,
        pairs,
        args.gate,
        target_share=DEFAULT_TARGET_SHARE if args.target_share is None else args.target_share,
        base=base,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        progress=not args.no_progress,
        source={**source, "base_config_file": args.config},
    )  # a target share out of reach raises before anything is written
    config_path, md_path = write_gate_calibration(calibration, args.out)
    print(calibration.markdown())
    print(
        f"config with {args.gate}'s {calibration.option} = {calibration.value:.4g}: {config_path} (use with --config "
        f"{config_path} and a method such as fides+{args.gate}); table: {md_path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
