"""Before/after decode speed of decoder v2, both decoders in one process on one loaded model.

The old code (commit d3638e8, before decoder v2) is taken from git and imported as `fides_rag_old`; the two
decoders alternate per prompt and method (order flipped every prompt), so machine drift hits both alike.
Decode ms/token = (time of 33 forced tokens - time of 1 token) / 32, median over the prompts. The prompts are
built once per example and passed as text, so stop strings of the template never end a decode early.

Usage (from the repository root):
    python results/decoder-v2/ab.py smollm2-135m-instruct 8 results/decoder-v2/ab-smollm2-135m-instruct.json
    python results/decoder-v2/ab.py MODEL N OUT.json standard template      # one method, one prompt shape
    python results/decoder-v2/ab.py MODEL N OUT.json cad,fides raw,template COMMIT  # "old" = another commit
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OLD_COMMIT = "d3638e8"


def import_old_package(root: Path, commit: str = OLD_COMMIT):
    """Extract fides_rag/ at `commit` into a temp dir as package `fides_rag_old` and import it."""
    target = Path(tempfile.mkdtemp()) / "fides_rag_old"
    archive = subprocess.run(["git", "-C", str(root), "archive", commit, "fides_rag"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target.parent)], input=archive, check=True)
    (target.parent / "fides_rag").rename(target)
    for path in target.rglob("*.py"):
        path.write_text(re.sub(r"\bfides_rag\b", "fides_rag_old", path.read_text()))
    sys.path.insert(0, str(target.parent))
    import fides_rag_old

    return fides_rag_old


def main() -> None:
    model_name, n_prompts, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    old_commit = sys.argv[6] if len(sys.argv) > 6 else OLD_COMMIT
    old = import_old_package(Path(__file__).resolve().parents[2], old_commit)
    from fides_rag import FidesDecoder, load_model
    from fides_rag.eval.bench import machine
    from fides_rag.eval.datasets import load_nq_swap

    model, tok = load_model(model_name, device="cpu")
    decoders = {"old": old.FidesDecoder(model, tok), "new": FidesDecoder(model, tok)}
    examples = load_nq_swap(None)[:n_prompts]
    methods = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else ("standard", "cad", "fides")
    shapes = tuple(sys.argv[5].split(",")) if len(sys.argv) > 5 else ("template", "raw")

    def timed(code: str, method: str, prompts: tuple[str, str], tokens: int, special: bool) -> tuple[float, int]:
        """Seconds and tokens of one decode; the prompts are built once, so no template stop ends it early."""
        start = time.perf_counter()
        result = decoders[code].generate_from_prompts(*prompts, method=method, max_new_tokens=tokens, min_new_tokens=tokens, add_special_tokens=special)
        return time.perf_counter() - start, len(result.token_ids)

    def prompt_pair(example, shape: str) -> tuple[tuple[str, str], bool]:
        if shape == "raw":  # ~20-token no-context prompt against the documents' ~160
            question = f"Question: {example.question}\nAnswer:"
            return (f"{' '.join(example.contexts)}\n{question}", question), True
        prepared = decoders["new"].prepare(example.question, list(example.contexts), 33)  # the 2-shot template
        return (prepared.context_prompt, prepared.no_context_prompt), not decoders["new"].use_chat_template

    samples: dict[str, dict[str, dict[str, list[float]]]] = {}
    for shape in shapes:
        for code in decoders:
            for method in methods:
                prompts, special = prompt_pair(examples[0], shape)
                timed(code, method, prompts, 3, special)  # warm-up
        for i, example in enumerate(examples):
            prompts, special = prompt_pair(example, shape)
            for method in methods:
                for code in ("old", "new") if i % 2 == 0 else ("new", "old"):
                    (one, _), (many, tokens) = timed(code, method, prompts, 1, special), timed(code, method, prompts, 33, special)
                    samples.setdefault(shape, {}).setdefault(method, {}).setdefault(code, []).append((many - one) / (tokens - 1) * 1000)
    medians = {s: {m: {c: statistics.median(v) for c, v in by_code.items()} for m, by_code in by_method.items()} for s, by_method in samples.items()}
    report = {"model": model_name, "old_commit": old_commit, "prompts": n_prompts, "machine": machine(), "median_decode_ms_per_token": medians, "decode_ms_per_token": samples}
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(medians, indent=1))


if __name__ == "__main__":
    main()
