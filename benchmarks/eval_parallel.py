"""Data-parallel `fides-rag eval`: one process against several (torchrun), same NQ-Swap slice, same metrics?

Runs `fides-rag eval` twice into `--runs`: once as one process with every thread (`one/`), once under
`torchrun --nproc_per_node N` with the threads split between the processes (`several/`). Prints the table of
examples per second and whether both runs' metrics are identical, and writes it as JSON to `--out`.

    python benchmarks/eval_parallel.py --model smollm2-135m-instruct --limit 48 \\
        --out results/eval-parallel/smollm2-135m-instruct-48.json
    python benchmarks/eval_parallel.py --table-only --runs runs/eval-parallel/smollm2-135m-instruct-48
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def eval_command(args: argparse.Namespace, out: Path) -> list[str]:
    return [
        "eval",
        "--model",
        args.model,
        "--dataset",
        "nq-swap",
        "--limit",
        str(args.limit),
        "--methods",
        args.methods,
        "--batch-size",
        "8",
        "--max-new-tokens",
        "16",
        "--device",
        "cpu",
        "--bootstrap",
        "200",
        "--no-progress",
        "--out",
        str(out),
    ]


def run_both(args: argparse.Namespace) -> None:
    """One process with every thread, then `--processes` processes under torchrun sharing the threads."""
    shutil.rmtree(args.runs, ignore_errors=True)
    one = [sys.executable, "-m", "fides_rag.cli.main", *eval_command(args, args.runs / "one")]
    several = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(args.processes),
        "-m",
        "fides_rag.cli.main",
        *eval_command(args, args.runs / "several"),
    ]
    for command, threads in ((one, args.threads), (several, max(1, args.threads // args.processes))):
        print(f"$ OMP_NUM_THREADS={threads} {' '.join(command)}", flush=True)
        subprocess.run(
            command, env={**os.environ, "OMP_NUM_THREADS": str(threads)}, check=True, stdout=subprocess.DEVNULL
        )


def table(runs: Path) -> dict:
    """Rows of the two runs' results.json and whether their metrics are identical."""
    rows = {}
    for name in ("one", "several"):
        path = runs / name / "results.json"
        if not path.is_file():
            raise SystemExit(
                f"eval_parallel: no {path}; run without --table-only first (or point --runs at finished runs)"
            )
        results = json.loads(path.read_text())
        run = results["run"]
        rows[name] = {
            "processes": run.get("processes", 1),
            "examples": run["decoded_now"],
            "seconds": run["seconds_now"],
            "examples_per_second": run["examples_per_second_now"],
            "metrics": {m: {k: v[k] for k in ("cf", "em", "f1", "accuracy")} for m, v in results["metrics"].items()},
        }
    return {**rows, "same_metrics": rows["one"]["metrics"] == rows["several"]["metrics"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="default: %(default)s")
    parser.add_argument("--limit", type=int, default=48, help="first N NQ-Swap examples (default: %(default)s)")
    parser.add_argument("--methods", default="standard,cad,fides", help="default: %(default)s")
    parser.add_argument("--processes", type=int, default=2, help="processes of the parallel run (default: %(default)s)")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="threads in all (default: the CPU count)"
    )
    parser.add_argument("--runs", type=Path, help="run folders (default: runs/eval-parallel/MODEL-LIMIT)")
    parser.add_argument("--out", type=Path, help="write the table as JSON here")
    parser.add_argument("--table-only", action="store_true", help="read finished runs in --runs, decode nothing")
    args = parser.parse_args(argv)
    args.runs = args.runs or Path("runs/eval-parallel") / f"{Path(args.model).name}-{args.limit}"
    if not args.table_only:
        run_both(args)
    report = table(args.runs)
    print("| processes | threads each | examples | seconds (decode, wall) | examples/s |\n|---|---|---|---|---|")
    for name, threads in (("one", args.threads), ("several", max(1, args.threads // args.processes))):
        r = report[name]
        print(
            f"| {r['processes']} | {threads} | {r['examples']} | {r['seconds']:.1f} | {r['examples_per_second']:.3f} |"
        )
    speedup = report["several"]["examples_per_second"] / report["one"]["examples_per_second"]
    print(
        f"\n{report['several']['processes']} processes / 1 process: {speedup:.2f}x; same metrics: "
        f"{report['same_metrics']}"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
