"""Before/after table of decoder v2 from the JSON reports beside this file.

`ab-<model>.json` were written by `ab.py`: the old (d3638e8) and new decoders alternating in one process,
the fair before/after. `old-`/`new-<model>.json` were written by `driver.py` in separate runs with each
code on PYTHONPATH: the full bench protocol (CFG peer, context growth), but runs apart in time on a
machine whose speed drifts by 20-40%. See README "Decoder v2 (issue 11): measured".
Usage: python results/decoder-v2/compare.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
LABELS = {"fides": "FIDES", "cad": "CAD", "standard": "standard"}


def median(report: dict, section: str, method: str, what: str = "decode_ms_per_token") -> float:
    return report[section][method][what]["median"]


def ab_table(path: Path) -> None:
    report = json.loads(path.read_text())
    model = report["model"]
    medians = report["median_decode_ms_per_token"]
    print(f"\n#### {model}: old and new decoder in one process ({report['prompts']} prompts, 32 tokens forced, batch 1, CPU; {path.name})\n")
    print("| prompts | method | before (ms/token) | after (ms/token) | after / before |")
    print("|---|---|---|---|---|")
    for shape, by_method in medians.items():
        for method, by_code in by_method.items():
            print(f"| {shape} | {method} | {by_code['old']:.1f} | {by_code['new']:.1f} | {by_code['new'] / by_code['old']:.2f} |")
    if not {"fides", "cad", "standard"} <= set(next(iter(medians.values()))):
        return
    print("\n| ratio | before | after |")
    print("|---|---|---|")
    for shape, by_method in medians.items():
        if not {"fides", "cad", "standard"} <= set(by_method):
            continue
        for a, b in (("fides", "cad"), ("fides", "standard"), ("cad", "standard")):
            print(f"| {LABELS[a]}/{LABELS[b]}, {shape} | "
                  f"{by_method[a]['old'] / by_method[b]['old']:.2f}x | {by_method[a]['new'] / by_method[b]['new']:.2f}x |")


def latency_after_head_fix(model: str) -> None:
    """The full bench latency protocol (transformers' CFG as the peer) run again after the CPU head fix."""
    path = HERE / f"latency-after-head-fix-{model}.json"
    if not path.exists():
        return
    report = json.loads(path.read_text())
    p = report["protocol"]
    print(f"\n#### {model}, after the head fix ({p['samples']} prompts after {p['warmup']} warm-up, {p['new_tokens']} tokens forced; {path.name})\n")
    print("| method | decode ms/token (median) |")
    print("|---|---|")
    for method in report["latency"]:
        if method != "prompts":
            print(f"| {method} | {median(report, 'latency', method):.1f} |")
    ratio = lambda a, b: median(report, "latency", a) / median(report, "latency", b)  # noqa: E731
    print(f"\nFIDES/standard {ratio('fides', 'standard'):.2f}x, FIDES/CAD {ratio('fides', 'cad'):.2f}x, CAD/CFG {ratio('cad', 'hf-cfg'):.2f}x")


def pad_table(model: str) -> None:
    """The 3-rows-to-4 head padding: `ab.py` runs against c7c508f (before it), pooled per prompt. FIDES/CAD per
    prompt pairs the two decodes of one prompt made seconds apart, which this drifting machine needs."""
    paths = sorted(HERE.glob(f"ab-pad-{model}*.json"))
    if not paths:
        return
    fides_cad: dict[str, dict[str, list[float]]] = {}
    change: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        for shape, d in json.loads(path.read_text())["decode_ms_per_token"].items():
            for code in ("old", "new"):
                fides_cad.setdefault(shape, {}).setdefault(code, []).extend(f / c for f, c in zip(d["fides"][code], d["cad"][code]))
            for method in ("cad", "fides"):
                change.setdefault(shape, {}).setdefault(method, []).extend(n / o for n, o in zip(d[method]["new"], d[method]["old"]))
    print(f"\n#### {model}: the 3-row head product padded to 4 ({', '.join(p.name for p in paths)}; medians of per-prompt ratios)\n")
    print("| prompts | prompts measured | FIDES/CAD before | FIDES/CAD after | FIDES after/before | CAD after/before (unchanged code: noise) |")
    print("|---|---|---|---|---|---|")
    for shape in fides_cad:
        m = statistics.median
        print(f"| {shape} | {len(fides_cad[shape]['old'])} | {m(fides_cad[shape]['old']):.2f}x | {m(fides_cad[shape]['new']):.2f}x | "
              f"{m(change[shape]['fides']):.2f} | {m(change[shape]['cad']):.2f} |")


def main() -> None:
    for model in ("smollm2-135m-instruct", "gemma3-270m"):
        for path in (HERE / f"ab-{model}.json", HERE / f"ab-standard-{model}.json"):
            if path.exists():
                ab_table(path)
        latency_after_head_fix(model)
        pad_table(model)
    for model in ("smollm2-135m-instruct", "gemma3-270m"):
        old_path, new_path = HERE / f"old-{model}.json", HERE / f"new-{model}.json"
        if not (old_path.exists() and new_path.exists()):
            continue
        old, new = json.loads(old_path.read_text()), json.loads(new_path.read_text())
        p = new["protocol"]
        print(f"\n#### {model} ({p['samples']} prompts after {p['warmup']} warm-up, {p['new_tokens']} tokens forced, batch 1, CPU)\n")
        print("| decode ms/token (median) | before | after |")
        print("|---|---|---|")
        for method in ("standard", "cad", "adacad", "fides", "hf-cfg"):
            print(f"| {method} (2-shot template) | {median(old, 'latency', method):.1f} | {median(new, 'latency', method):.1f} |")
        for method in ("standard", "cad", "fides"):
            print(f"| {method} (raw prompts) | {median(old, 'raw', method):.1f} | {median(new, 'raw', method):.1f} |")
        print("\n| ratio | before | after |")
        print("|---|---|---|")
        rows = [
            ("FIDES/standard", "latency", "fides", "standard"),
            ("FIDES/CAD", "latency", "fides", "cad"),
            ("CAD/CFG (transformers)", "latency", "cad", "hf-cfg"),
            ("FIDES/CAD, raw prompts", "raw", "fides", "cad"),
            ("FIDES/standard, raw prompts", "raw", "fides", "standard"),
        ]
        for label, section, a, b in rows:
            ratio = lambda r: median(r, section, a) / median(r, section, b)  # noqa: E731
            print(f"| {label} | {ratio(old):.2f}x | {ratio(new):.2f}x |")
        if "context" in old and "context" in new:
            context_table(old, new, HERE / f"context-after-head-fix-{model}.json")


def context_table(old: dict, new: dict, later_path: Path) -> None:
    """KV bytes and FIDES decode speed by context length: before, v2, and (if measured) v2 with the CPU head fix."""
    later = json.loads(later_path.read_text())["context"] if later_path.exists() else {}
    print("\n| context tokens | standard KV bytes (before / after) | FIDES KV bytes (before / after) | FIDES / (standard + question-alone need) after "
          "| standard decode ms/token (before / v2 / v2 + head fix) | FIDES decode ms/token (before / v2 / v2 + head fix) |")
    print("|---|---|---|---|---|---|")
    for length, row in new["context"].items():
        o, h = old["context"][length], later.get(length)
        ms = lambda method: " / ".join(  # noqa: E731
            f"{r[method]['decode_ms_per_token']:.1f}" if r else "-" for r in (o, row, h)
        )
        print(
            f"| {row['prompt_tokens']} (no-context {row['no_context_tokens']}) | {o['standard']['kv_cache_bytes']:,} / {row['standard']['kv_cache_bytes']:,} | "
            f"{o['fides']['kv_cache_bytes']:,} / {row['fides']['kv_cache_bytes']:,} | "
            f"{row['fides']['kv_cache_bytes'] / (row['standard']['kv_cache_bytes'] * (1 + row['no_context_tokens'] / row['prompt_tokens'])):.3f} | "
            f"{ms('standard')} | {ms('fides')} |"
        )

if __name__ == "__main__":
    main()
