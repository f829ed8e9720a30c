"""Before/after tables from the JSON reports of `benchmarks/decoder_ab.py`.

For each report: decode ms/token per prompt shape and method (median over the prompts) on both sides, and the
FIDES/CAD, FIDES/standard and CAD/standard ratios. With `--paired`, one more table pools the reports' prompts and
takes the median of per-prompt ratios: FIDES/CAD pairs the two decodes of one prompt made seconds apart, which a
machine whose speed drifts needs.

    python benchmarks/decoder_ab_tables.py results/decoder-v2/ab-smollm2-135m-instruct.json
    python benchmarks/decoder_ab_tables.py --paired results/decoder-v2/ab-pad-gemma3-270m*.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

LABELS = {"fides": "FIDES", "cad": "CAD", "standard": "standard"}
RATIOS = (("fides", "cad"), ("fides", "standard"), ("cad", "standard"))


def ab_table(path: Path) -> str:
    """The per-method before/after table of one report, and its ratio table when it holds standard, CAD and FIDES."""
    report = json.loads(path.read_text())
    medians = report["median_decode_ms_per_token"]
    old = report.get("old_revision", report.get("old_commit"))
    lines = [
        f"#### {report['model']}: {old} (before) against the tree of the run (after), {report['prompts']} prompts "
        f"({path.name})",
        "",
        "| prompts | method | before (ms/token) | after (ms/token) | after / before |",
        "|---|---|---|---|---|",
    ]
    for shape, by_method in medians.items():
        for method, by_side in by_method.items():
            lines.append(
                f"| {shape} | {method} | {by_side['old']:.1f} | {by_side['new']:.1f} | "
                f"{by_side['new'] / by_side['old']:.2f} |"
            )
    shapes = [s for s, by_method in medians.items() if set(LABELS) <= set(by_method)]
    if shapes:
        lines += ["", "| ratio | before | after |", "|---|---|---|"]
        for shape in shapes:
            m = medians[shape]
            for a, b in RATIOS:
                lines.append(
                    f"| {LABELS[a]}/{LABELS[b]}, {shape} | {m[a]['old'] / m[b]['old']:.2f}x | "
                    f"{m[a]['new'] / m[b]['new']:.2f}x |"
                )
    return "\n".join(lines)


def paired_table(paths: list[Path]) -> str:
    """FIDES/CAD per prompt, before and after, and each method's after/before per prompt, pooled over `paths`."""
    fides_cad: dict[str, dict[str, list[float]]] = {}
    change: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        for shape, d in json.loads(path.read_text())["decode_ms_per_token"].items():
            if not {"fides", "cad"} <= set(d):
                raise SystemExit(
                    f"decoder_ab_tables: --paired needs cad and fides in every report; {path.name} ({shape}) has "
                    f"{sorted(d)}"
                )
            for side in ("old", "new"):
                fides_cad.setdefault(shape, {}).setdefault(side, []).extend(
                    f / c for f, c in zip(d["fides"][side], d["cad"][side])
                )
            for method in ("cad", "fides"):
                change.setdefault(shape, {}).setdefault(method, []).extend(
                    n / o for n, o in zip(d[method]["new"], d[method]["old"])
                )
    m = statistics.median
    lines = [
        f"#### Medians of per-prompt ratios ({', '.join(p.name for p in paths)})",
        "",
        "| prompts | prompts measured | FIDES/CAD before | FIDES/CAD after | FIDES after/before | CAD after/before |",
        "|---|---|---|---|---|---|",
    ]
    for shape, by_side in fides_cad.items():
        lines.append(
            f"| {shape} | {len(by_side['old'])} | {m(by_side['old']):.2f}x | {m(by_side['new']):.2f}x | "
            f"{m(change[shape]['fides']):.2f} | {m(change[shape]['cad']):.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="JSON files written by benchmarks/decoder_ab.py")
    parser.add_argument("--paired", action="store_true", help="also pool the reports' prompts into per-prompt ratios")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.reports if not p.is_file()]
    if missing:
        parser.error(f"no such report: {', '.join(missing)}")
    print("\n\n".join(ab_table(p) for p in args.reports))
    if args.paired:
        print("\n" + paired_table(args.reports))


if __name__ == "__main__":
    main()
