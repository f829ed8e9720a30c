"""Before/after table of decoder v2 from the JSON reports beside this file.

The reports were written by `driver.py` (beside this file) run once with the code of commit d3638e8 on
PYTHONPATH ("old") and once with decoder v2 ("new"); see README "Decoder v2: measured".
Usage: python results/decoder-v2/compare.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent


def median(report: dict, section: str, method: str, what: str = "decode_ms_per_token") -> float:
    return report[section][method][what]["median"]


def main() -> None:
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
            print("\n| context tokens | standard KV bytes (before / after) | FIDES KV bytes (before / after) | FIDES / (standard + question-alone need) after | FIDES decode ms/token (before / after) |")
            print("|---|---|---|---|---|")
            for length, row in new["context"].items():
                o = old["context"][length]
                print(
                    f"| {row['prompt_tokens']} (no-context {row['no_context_tokens']}) | {o['standard']['kv_cache_bytes']:,} / {row['standard']['kv_cache_bytes']:,} | "
                    f"{o['fides']['kv_cache_bytes']:,} / {row['fides']['kv_cache_bytes']:,} | "
                    f"{row['fides']['kv_cache_bytes'] / (row['standard']['kv_cache_bytes'] * (1 + row['no_context_tokens'] / row['prompt_tokens'])):.3f} | "
                    f"{o['fides']['decode_ms_per_token']:.1f} / {row['fides']['decode_ms_per_token']:.1f} |"
                )


if __name__ == "__main__":
    main()
