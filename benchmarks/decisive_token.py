"""The decisive token: on true-conflict rows, how strong a CAD-style contrast must be to put the passage's answer first.

A true-conflict row has a swapped passage whose original answer the model knew closed-book (`fides_rag.eval.strata`).
Both prompts are built by the decoder's own prompt builder (`FidesDecoder.prepare`) and teacher-forced once each,
with no generation. On the first answer token, for the substituted answer s (the passage's) against every other token
of the vocabulary, the contrast z(a) = (1+a)·z_ctx − a·z_noctx ranks s first exactly for a in an interval (lo, hi),
computed in float64 (`alpha_interval`). Beside it, FIDES's own a on that token: `FidesRule().combine` on the same
pass (context and no-context logits, every block's last-position state of both paths, the context path's logit lens),
and with `--config`, a calibrated FidesConfig's a as a second column.

The first answer token of an answer is the first token the tokenizer gives for (prompt text + answer) after the
prompt's own tokens (a plain-text prompt ends in "Answer:", and the answer follows after a space, as in the
demonstrations; a chat prompt ends in the generation prompt). When that tokenisation does not keep the prompt's
tokens, the answer is tokenised alone after a space, and the row is counted (`fallback_tokenisation`). Rows whose s
and o begin with the same token cannot be told apart there: they are counted (`same_first_token`) and left out of the
summary, unless `--divergent` measures the first token where they differ, with the tokens they share teacher-forced
on both paths.

    python benchmarks/decisive_token.py --model gemma3-270m \\
        --closed-book results/eval/gemma3-bigbench-strata/closed_book.jsonl \\
        --config results/calibration/gemma3-270m.json --out results/decisive-token/gemma3-270m.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fides_rag
from fides_rag import FidesDecoder
from fides_rag.eval.closed_book import question_key, read_closed_book
from fides_rag.eval.datasets import QAExample, dataset_files, load_examples
from fides_rag.eval.metrics import containment
from fides_rag.eval.store import files_sha256
from fides_rag.eval.strata import stratum_of
from fides_rag.method.config import FidesConfig
from fides_rag.method.lens import ModelAnatomy
from fides_rag.method.signals import contrast_logits
from fides_rag.rules.base import StepInputs
from fides_rag.rules.fides import FidesRule

TINY = "tiny-llama"
"""`--tiny`: a tiny random-weight Llama and the test tokenizer, for the script's own test."""
PROMPT_TOKENS = 32
"""The answer budget the prompts are fitted with (documents trimmed so that prompt + budget fits), as a decode of
`fides-rag eval`'s default max_new_tokens would."""


# -- the interval of alpha ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AlphaInterval:
    """Where (1+a)·z_ctx − a·z_noctx ranks token s first over a >= 0: every a with lo < a < hi, and a = 0 as well
    when s is already the context path's strict argmax. Empty (not flippable) when lo >= hi."""

    lo: float
    """The smallest a that ranks s first (its infimum: at lo itself s ties a competitor, unless lo is 0)."""
    hi: float
    """Where s stops being first (inf: it never does)."""
    already_first: bool
    """s is the context path's strict argmax (a = 0)."""

    @property
    def flippable(self) -> bool:
        """Some a >= 0 ranks s first."""
        return self.lo < self.hi

    def contains(self, alpha: float) -> bool:
        """Whether the contrast at `alpha` ranks s strictly first."""
        return (self.lo < alpha < self.hi) or (alpha == 0.0 and self.already_first)


def alpha_interval(ctx_logits: torch.Tensor, no_ctx_logits: torch.Tensor, s: int) -> AlphaInterval:
    """The a >= 0 at which the CAD contrast of two [V] logit vectors puts token `s` strictly first, exactly in float64.

    For each competitor v, with dc = z_ctx[s] − z_ctx[v] and dn = z_noctx[s] − z_noctx[v], s beats v at a when
    dc + a·(dc − dn) > 0: a lower bound −dc/k where k = dc − dn > 0, an upper bound where k < 0, always (dc > 0) or
    never (dc <= 0) where k = 0. The interval is the intersection of these half-lines with a >= 0."""
    z_ctx = ctx_logits.detach().to("cpu", torch.float64).reshape(-1)
    z_no = no_ctx_logits.detach().to("cpu", torch.float64).reshape(-1)
    others = torch.ones_like(z_ctx, dtype=torch.bool)
    others[s] = False
    dc = (z_ctx[s] - z_ctx)[others]  # [V-1]
    dn = (z_no[s] - z_no)[others]
    k = dc - dn
    already = bool((dc > 0).all())
    if bool(((k == 0) & (dc <= 0)).any()):
        return AlphaInterval(math.inf, -math.inf, already)
    rising, falling = k > 0, k < 0
    lo = max(0.0, float((-dc[rising] / k[rising]).max())) if bool(rising.any()) else 0.0
    hi = float((-dc[falling] / k[falling]).min()) if bool(falling.any()) else math.inf
    return AlphaInterval(lo, hi, already)


def pairwise_alpha(dc: float, dn: float) -> float | None:
    """The a from which s beats one competitor alone (dc, dn: s minus it on each path): 0 when it already does and
    keeps doing, None when no a >= 0 makes or keeps it so from some point on."""
    k = dc - dn
    if k > 0:
        return max(0.0, -dc / k)
    return 0.0 if dc > 0 and k == 0 else None


# -- rows ------------------------------------------------------------------------------------------


def read_answers(path: Path, model: str, max_new_tokens: int | None) -> tuple[dict[str, str], int]:
    """key -> closed-book answer of `model` in a closed_book.jsonl, and the max_new_tokens its lines were decoded with
    (given, or the one the file holds for the model; a ValueError when it holds several and none was given)."""
    if not path.is_file():
        raise FileNotFoundError(f"closed-book file not found: {path}")
    budgets: set[int] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a half-written last line: read_closed_book skips it
        if isinstance(record, dict) and record.get("model") == model and isinstance(record.get("max_new_tokens"), int):
            budgets.add(record["max_new_tokens"])
    if max_new_tokens is None:
        if len(budgets) > 1:
            raise ValueError(
                f"{path} holds closed-book answers of {model!r} at several max_new_tokens {sorted(budgets)}; "
                "choose one with --closed-book-tokens"
            )
        if not budgets:
            raise ValueError(f"{path} holds no closed-book answer of {model!r}; set --closed-book-model")
        max_new_tokens = budgets.pop()
    return read_closed_book(path, {"model": model, "max_new_tokens": max_new_tokens}), max_new_tokens


def known_original(closed_book_answer: str, originals: Sequence[str]) -> str:
    """The original answer the closed-book answer gives (the first that it contains), else the first."""
    return next((a for a in originals if containment(closed_book_answer, [a])), originals[0])


@dataclass
class Selection:
    """The true-conflict rows to measure, and what the filter counted."""

    rows: list[tuple[QAExample, str]]
    """(example, the original answer the model knew)."""
    counts: dict[str, int]


def true_conflicts(
    examples: Iterable[QAExample], answers: Mapping[str, str], model: str, limit: int | None
) -> Selection:
    """The swapped-passage rows whose original answer `model` gave closed-book, in dataset order, at most `limit`;
    counts: rows read, swapped rows, those without a cached closed-book answer (skipped), supplied, true conflicts."""
    counts = dict.fromkeys(("rows_read", "swapped", "no_closed_book", "supplied", "true_conflict"), 0)
    rows: list[tuple[QAExample, str]] = []
    for example in examples:
        counts["rows_read"] += 1
        if not example.is_conflict:
            continue
        counts["swapped"] += 1
        answer = answers.get(question_key(model, example.question))
        if answer is None:
            counts["no_closed_book"] += 1
            continue
        if not example.original_answers or stratum_of(example, answer) != "true_conflict":
            counts["supplied"] += 1
            continue
        counts["true_conflict"] += 1
        if limit is None or len(rows) < limit:
            rows.append((example, known_original(answer, example.original_answers)))
    return Selection(rows, counts)


def answer_tokens(decoder: FidesDecoder, prompt: str, prompt_ids: Sequence[int], answer: str) -> tuple[list[int], bool]:
    """The tokens of `answer` after `prompt` as the tokenizer splits (prompt text + answer), and whether the fallback
    (the answer alone after a space) was needed because that split moved the prompt's own tokens."""
    preparer = decoder.prompts
    joint = "" if preparer.use_chat_template else " "  # the template's demonstrations: "Answer: <answer>"
    ids = list(preparer.encode(prompt + joint + answer, templated=preparer.use_chat_template))
    if len(ids) > len(prompt_ids) and ids[: len(prompt_ids)] == list(prompt_ids):
        return [int(i) for i in ids[len(prompt_ids) :]], False
    alone = decoder.tokenizer(" " + answer, add_special_tokens=False)["input_ids"]
    if not alone:
        raise ValueError(f"the answer {answer!r} has no tokens")
    return [int(i) for i in alone], True


def decisive_position(s_ids: Sequence[int], o_ids: Sequence[int], divergent: bool) -> int | None:
    """Where the decisive token sits in the answers' tokens: 0 (the first answer token), or with `divergent` the first
    position where s and o differ (None when one's tokens begin the other's)."""
    if not divergent:
        return 0
    shared = next((i for i, (a, b) in enumerate(zip(s_ids, o_ids)) if a != b), None)
    return shared


# -- the teacher-forced pass -----------------------------------------------------------------------


@dataclass
class PathPass:
    """One path's next-token logits [V], every block's last-position state [L, H], and logit-lens logits."""

    logits: torch.Tensor
    states: torch.Tensor
    lens: dict[int, torch.Tensor]


@contextlib.contextmanager
def block_outputs(anatomy: ModelAnatomy) -> Iterator[dict[int, torch.Tensor]]:
    """While open, layer l (1-based) -> the last-position output [R, H] of block l after each forward (the states
    the engine hands FIDES's Shift and logit lens)."""
    states: dict[int, torch.Tensor] = {}

    def keep(layer: int) -> Any:
        def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output  # [R, T, H]
            states[layer] = hidden[:, -1, :].clone()  # [R, H]

        return hook

    handles = [block.register_forward_hook(keep(layer)) for layer, block in enumerate(anatomy.layers, 1)]
    try:
        yield states
    finally:
        for handle in handles:
            handle.remove()


def forward_path(
    anatomy: ModelAnatomy, ids: Sequence[int], device: torch.device, lens_layers: Sequence[int]
) -> PathPass:
    """One teacher-forced forward of a prompt (no cache): the final logits, the blocks' last-position outputs and the
    logit lens at `lens_layers` (the final norm, head and soft-capping on a block's output, as the engine makes it)."""
    input_ids = torch.tensor([list(ids)], device=device)
    with torch.inference_mode(), block_outputs(anatomy) as captured:
        hidden = anatomy.backbone(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False
        ).last_hidden_state  # [1, T, H], final-normed
        last = hidden[:, -1, :]
        logits = anatomy.head_logits(last).float()[0]  # [V]
        lens = {
            layer: anatomy.head_logits(anatomy.final_norm(captured[layer].to(last.device))).float()[0]
            for layer in lens_layers
        }
        layers = range(1, anatomy.num_layers + 1)
        states = torch.stack([captured[layer][0].to(last.device) for layer in layers]).float()  # [L, H]
    return PathPass(logits, states, lens)


def fides_alpha(rule: FidesRule, ctx: PathPass, no_ctx: PathPass, num_layers: int) -> dict[str, float]:
    """FIDES's a and its signals on one token, from `rule.combine` on the teacher-forced pass."""
    step = StepInputs.from_tensors(
        ctx.logits[None],
        no_ctx.logits[None],
        ctx_layer_states=ctx.states[:, None],  # [L, 1, H]
        no_ctx_layer_states=no_ctx.states[:, None],
        lens_logits={layer: value[None] for layer, value in ctx.lens.items()},
        num_layers=num_layers,
    )
    records = rule.combine(step).records
    return {name: float(value.reshape(-1)[0]) for name, value in records.items()}


def rule_columns(config: FidesConfig | None) -> dict[str, FidesRule]:
    """Column name -> the FIDES rule it reports: the source's constants, and a calibrated config when given."""
    rules = {"fides": FidesRule()}
    if config is not None:
        rules["calibrated"] = FidesRule(config.without_gates())
    return rules


def measure_row(
    decoder: FidesDecoder,
    anatomy: ModelAnatomy,
    rules: Mapping[str, FidesRule],
    example: QAExample,
    original: str,
    divergent: bool = False,
) -> dict[str, Any]:
    """The decisive-token record of one true-conflict row: on the first answer token, or with `divergent` on the first
    token where s and o differ, both paths teacher-forced through the tokens they share (as the decoder appends a
    chosen token to both). `s_token == o_token` (`same_first_token`) when they cannot be told apart there."""
    substituted = example.context_answers[0].strip()
    original = original.strip()
    prepared = decoder.prepare(example.question, list(example.contexts), PROMPT_TOKENS)
    s_ids, s_fallback = answer_tokens(decoder, prepared.context_prompt, prepared.context_ids, substituted)
    o_ids, o_fallback = answer_tokens(decoder, prepared.context_prompt, prepared.context_ids, original)
    position = decisive_position(s_ids, o_ids, divergent)
    shared = s_ids[: position or 0]
    s, o = s_ids[position or 0], o_ids[position or 0]
    num_layers = anatomy.num_layers
    lens_layers = sorted({layer for rule in rules.values() for layer in rule.lens_layers(num_layers)})
    ctx = forward_path(anatomy, [*prepared.context_ids, *shared], decoder.device, lens_layers)
    no_ctx = forward_path(anatomy, [*prepared.no_context_ids, *shared], decoder.device, ())
    interval = alpha_interval(ctx.logits, no_ctx.logits, s)
    z_ctx, z_no = ctx.logits.double().cpu(), no_ctx.logits.double().cpu()
    dc_o, dn_o = float(z_ctx[s] - z_ctx[o]), float(z_no[s] - z_no[o])
    tokenizer = decoder.tokenizer
    record: dict[str, Any] = {
        "id": example.id,
        "question": example.question,
        "s": substituted,
        "o": original,
        "s_token": s,
        "o_token": o,
        "s_token_text": tokenizer.decode([s]),
        "o_token_text": tokenizer.decode([o]),
        "fallback_tokenisation": s_fallback or o_fallback,
        "position": position,
        "forced_prefix": tokenizer.decode(shared),
        "same_first_token": s == o,
        "documents_trimmed": prepared.documents_trimmed,
        "prompt_tokens": [len(prepared.context_ids), len(prepared.no_context_ids)],
        "context_argmax": int(z_ctx.argmax()),
        "no_context_argmax": int(z_no.argmax()),
        "already_first": interval.already_first,
        "o_first_no_context": int(z_no.argmax()) == o,
        "flippable": interval.flippable,
        "alpha_star": interval.lo if interval.flippable else None,
        "alpha_upper": (None if math.isinf(interval.hi) else interval.hi) if interval.flippable else None,
        "dc_o": dc_o,
        "dn_o": dn_o,
        "alpha_vs_o": pairwise_alpha(dc_o, dn_o),
    }
    for column, rule in rules.items():
        signals = fides_alpha(rule, ctx, no_ctx, num_layers)
        alpha = signals["alpha"]
        contrasted = contrast_logits(z_ctx, z_no, alpha)
        record[column] = {
            **signals,
            "at_least_alpha_star": interval.flippable and alpha >= interval.lo,
            "in_interval": interval.contains(alpha),
            "ranks_s_first": int(contrasted.argmax()) == s,
        }
    return record


# -- the summary -----------------------------------------------------------------------------------


def quartiles(values: Sequence[float]) -> dict[str, Any]:
    """n, p25, median and p75 (numpy's linear interpolation) of `values`; None figures when empty."""
    if not values:
        return {"n": 0, "p25": None, "median": None, "p75": None}
    p25, median, p75 = np.percentile(np.asarray(values, dtype=np.float64), [25.0, 50.0, 75.0])
    return {"n": len(values), "p25": float(p25), "median": float(median), "p75": float(p75)}


def share(hits: int, total: int) -> float | None:
    """hits / total, None when total is 0."""
    return hits / total if total else None


def summarize(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> dict[str, Any]:
    """The figures over the measured rows whose s and o start with different tokens."""
    rows = [r for r in records if not r["same_first_token"]]
    flippable = [r for r in rows if r["flippable"]]
    stars = [float(r["alpha_star"]) for r in flippable]
    summary: dict[str, Any] = {
        "measured": len(records),
        "same_first_token": len(records) - len(rows),
        "fallback_tokenisation": sum(1 for r in records if r["fallback_tokenisation"]),
        "documents_trimmed": sum(1 for r in records if r["documents_trimmed"]),
        "rows": len(rows),
        "questions": len({r["question"] for r in rows}),
        "share_flippable": share(len(flippable), len(rows)),
        "share_already_first": share(sum(1 for r in rows if r["already_first"]), len(rows)),
        "share_o_first_no_context": share(sum(1 for r in rows if r["o_first_no_context"]), len(rows)),
        "alpha_star_positive": quartiles([a for a in stars if a > 0]),
        "alpha_star_flippable": quartiles(stars),
        "bounded_above": sum(1 for r in flippable if r["alpha_upper"] is not None),
    }
    for column in columns:
        summary[column] = {
            "alpha": quartiles([float(r[column]["alpha"]) for r in rows]),
            "share_at_least_alpha_star": share(
                sum(1 for r in flippable if r[column]["at_least_alpha_star"]), len(flippable)
            ),
            "share_flips": share(sum(1 for r in flippable if r[column]["in_interval"]), len(flippable)),
            "share_ranks_s_first": share(sum(1 for r in rows if r[column]["ranks_s_first"]), len(rows)),
        }
    return summary


def _cell(value: Any, percent: bool = False) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}%" if percent else f"{value:.3g}"


def table(report: Mapping[str, Any]) -> str:
    """The summary as a short markdown table."""
    s = report["summary"]
    counts = report["counts"]
    star, positive = s["alpha_star_flippable"], s["alpha_star_positive"]
    lines = [
        f"{report['settings']['model']} on {report['settings']['dataset']}: {counts['true_conflict']} true conflicts "
        f"({counts['no_closed_book']} swapped rows without a closed-book answer skipped, {counts['supplied']} "
        f"supplied); {s['measured']} measured, {s['same_first_token']} left out (s and o share the measured token), "
        f"{s['fallback_tokenisation']} tokenised by the fallback.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| rows (questions) | {s['rows']} ({s['questions']}) |",
        f"| flippable | {_cell(s['share_flippable'], True)} |",
        f"| s already first on the context path | {_cell(s['share_already_first'], True)} |",
        f"| o first on the no-context path | {_cell(s['share_o_first_no_context'], True)} |",
        f"| alpha* over flippable: median [p25, p75] | {_cell(star['median'])} [{_cell(star['p25'])}, "
        f"{_cell(star['p75'])}] (n {star['n']}) |",
        f"| alpha* where > 0: median [p25, p75] | {_cell(positive['median'])} [{_cell(positive['p25'])}, "
        f"{_cell(positive['p75'])}] (n {positive['n']}) |",
    ]
    for column in report["columns"]:
        c = s[column]
        a = c["alpha"]
        lines += [
            f"| {column} alpha: median [p25, p75] | {_cell(a['median'])} [{_cell(a['p25'])}, {_cell(a['p75'])}] |",
            f"| {column} alpha >= alpha* (of flippable) | {_cell(c['share_at_least_alpha_star'], True)} |",
            f"| {column} alpha inside the interval (of flippable) | {_cell(c['share_flips'], True)} |",
        ]
    return "\n".join(lines)


# -- the script ------------------------------------------------------------------------------------


def load(args: argparse.Namespace) -> FidesDecoder:
    """The decoder whose prompt builder and model are measured."""
    if args.tiny:
        from fides_rag.testing import build_tiny_model, build_tokenizer

        tokenizer = build_tokenizer()
        model = build_tiny_model("llama", len(tokenizer), max_position_embeddings=4096)
        return FidesDecoder(model, tokenizer)
    return FidesDecoder.from_pretrained(args.model, device=args.device, dtype=args.dtype)


def settings(args: argparse.Namespace, model: str, closed_book_tokens: int, decoder: FidesDecoder) -> dict[str, Any]:
    """What the report was measured with."""
    files = dataset_files(args.dataset, args.data)
    config = FidesConfig.from_file(args.config).to_dict() if args.config else None
    return {
        "model": model,
        "dataset": args.dataset,
        "data": args.data,
        "data_files": [str(f) for f in files],
        "data_sha256": files_sha256(files) if files else None,
        "closed_book": str(args.closed_book),
        "closed_book_sha256": files_sha256([args.closed_book]),
        "closed_book_model": args.closed_book_model or model,
        "closed_book_max_new_tokens": closed_book_tokens,
        "config": str(args.config) if args.config else None,
        "calibrated_config": config,
        "fides_config": FidesConfig().to_dict(),
        "limit": args.limit,
        "token": "first where s and o differ" if args.divergent else "first answer token",
        "prompt_budget_tokens": PROMPT_TOKENS,
        "use_chat_template": decoder.prompts.use_chat_template,
        "device": str(decoder.device),
        "dtype": str(next(decoder.model.parameters()).dtype).removeprefix("torch."),
        "contrast": "(1 + a) z_ctx - a z_noctx on raw logits, exact over the vocabulary in float64",
        "torch": torch.__version__,
        "fides_rag": fides_rag.__version__,
        "machine": platform.processor() or platform.machine(),
    }


def write(path: Path | None, report: Mapping[str, Any]) -> None:
    """Write the report (JSON), replacing the file whole."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    partial.replace(path)


def main(argv: list[str] | None = None) -> None:
    """Measure every selected true-conflict row; write the JSON (every `--save-every` rows and at the end)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m", help="a bundled alias, hub id or folder")
    parser.add_argument("--tiny", action="store_true", help="a tiny random Llama instead of --model (tests)")
    parser.add_argument("--dataset", default="bigbench-conflicts", help="a load_examples name (default: %(default)s)")
    parser.add_argument("--data", help="the dataset's file, if not the default one")
    parser.add_argument("--closed-book", type=Path, required=True, help="a closed_book.jsonl of a strata run")
    parser.add_argument("--closed-book-model", help="the model id its answers are keyed by (default: --model)")
    parser.add_argument("--closed-book-tokens", type=int, help="its max_new_tokens, when the file holds several")
    parser.add_argument("--config", type=Path, help="a FidesConfig JSON whose alpha is reported as a second column")
    parser.add_argument("--limit", type=int, help="measure at most this many true-conflict rows (in dataset order)")
    parser.add_argument("--out", type=Path, help="the JSON report (e.g. results/decisive-token/<name>.json)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", help="the model's dtype (default: the decoder's, float32 on a CPU)")
    parser.add_argument(
        "--divergent",
        action="store_true",
        help="measure the first token where s and o differ (the shared tokens teacher-forced), not the first one",
    )
    parser.add_argument("--save-every", type=int, default=25, help="rewrite --out every this many rows")
    args = parser.parse_args(argv)
    model = TINY if args.tiny else args.model
    answers, closed_tokens = read_answers(args.closed_book, args.closed_book_model or model, args.closed_book_tokens)
    config = FidesConfig.from_file(args.config) if args.config else None
    selection = true_conflicts(
        load_examples(args.dataset, args.data), answers, args.closed_book_model or model, args.limit
    )
    print(json.dumps(selection.counts), file=sys.stderr, flush=True)
    decoder = load(args)
    anatomy = ModelAnatomy.of(decoder.model)
    rules = rule_columns(config)
    report: dict[str, Any] = {
        "settings": settings(args, model, closed_tokens, decoder),
        "columns": list(rules),
        "counts": selection.counts,
        "summary": {},
        "records": [],
    }
    start = time.perf_counter()
    for number, (example, original) in enumerate(selection.rows, 1):
        report["records"].append(measure_row(decoder, anatomy, rules, example, original, args.divergent))
        if number % args.save_every == 0 or number == len(selection.rows):
            report["summary"] = summarize(report["records"], list(rules))
            report["seconds"] = time.perf_counter() - start
            write(args.out, report)
            print(f"{number}/{len(selection.rows)} rows, {report['seconds']:.0f} s", file=sys.stderr, flush=True)
    report["summary"] = summarize(report["records"], list(rules))
    report["seconds"] = time.perf_counter() - start
    write(args.out, report)
    print(table(report))


if __name__ == "__main__":
    main()
