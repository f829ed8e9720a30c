"""benchmarks/decisive_token.py: the exact interval of CAD strengths that rank the passage's answer first, against a
scan over alpha, and one end-to-end run on a tiny random model."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "decisive_token.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("decisive_token", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["decisive_token"] = module
    spec.loader.exec_module(module)
    return module


def _scan(ctx: torch.Tensor, no_ctx: torch.Tensor, s: int, alphas: torch.Tensor) -> torch.Tensor:
    """[A] whether (1+a) z_ctx − a z_noctx ranks s strictly first at each a, by brute force in float64."""
    z = (1 + alphas[:, None]) * ctx[None] - alphas[:, None] * no_ctx[None]  # [A, V]
    others = torch.cat([z[:, :s], z[:, s + 1 :]], dim=1)
    return z[:, s] > others.max(dim=1).values


def _agrees_with_scan(interval, ctx: torch.Tensor, no_ctx: torch.Tensor, s: int) -> None:
    alphas = torch.linspace(0.0, 40.0, 8001, dtype=torch.float64)
    scanned = _scan(ctx, no_ctx, s, alphas)
    for alpha, first in zip(alphas.tolist(), scanned.tolist()):
        near = [b for b in (interval.lo, interval.hi) if abs(alpha - b) < 1e-6]
        if not near:
            assert interval.contains(alpha) == first, (alpha, interval)
    assert interval.flippable == bool(scanned.any()) or interval.lo > 39.9


def test_the_interval_matches_a_scan_over_alpha():
    decisive = _script()
    s = 0
    # s already first on the context path, and the no-context path agrees: every alpha keeps it first
    ctx = torch.tensor([3.0, 1.0, 0.5, -1.0], dtype=torch.float64)
    interval = decisive.alpha_interval(ctx, ctx - 0.5, s)
    assert interval.already_first and interval.lo == 0.0 and interval.hi == float("inf")
    _agrees_with_scan(interval, ctx, ctx - 0.5, s)
    # s never first: it loses on the context path and dn >= dc for every competitor
    ctx = torch.tensor([1.0, 2.0, 0.0, -1.0], dtype=torch.float64)
    no_ctx = ctx.clone()
    no_ctx[s] += 0.7
    interval = decisive.alpha_interval(ctx, no_ctx, s)
    assert not interval.flippable and not interval.already_first
    _agrees_with_scan(interval, ctx, no_ctx, s)
    # a bounded interval: token 1 falls behind from alpha 0.5 on, token 2 overtakes s again at alpha 2
    ctx = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    no_ctx = torch.tensor([0.0, 3.0, -1.5], dtype=torch.float64)
    interval = decisive.alpha_interval(ctx, no_ctx, s)
    assert interval.lo == pytest.approx(0.5) and interval.hi == pytest.approx(2.0) and interval.flippable
    _agrees_with_scan(interval, ctx, no_ctx, s)
    # random logits, float32 inputs read as float64
    generator = torch.Generator().manual_seed(0)
    kinds = {"flippable": 0, "first": 0, "never": 0}
    for _ in range(300):
        ctx = torch.randn(6, generator=generator)
        no_ctx = ctx + 0.8 * torch.randn(6, generator=generator)
        s = int(torch.randint(6, (1,), generator=generator))
        interval = decisive.alpha_interval(ctx, no_ctx, s)
        _agrees_with_scan(interval, ctx.double(), no_ctx.double(), s)
        kinds["first" if interval.already_first else "flippable" if interval.flippable else "never"] += 1
    assert all(kinds.values()), kinds
    assert decisive.pairwise_alpha(-1.0, -3.0) == pytest.approx(0.5)
    assert decisive.pairwise_alpha(-1.0, 0.0) is None and decisive.pairwise_alpha(1.0, 1.0) == 0.0


ROWS = [  # question, passage, substituted answer, original answer, closed-book answer (None: not cached)
    ("What is the capital of France?", "Lyon is the capital of France.", "Lyon", "Paris", "Paris"),
    (
        "Which city is the capital of Australia?",
        "The capital of Australia is Melbourne.",
        "Melbourne",
        "Canberra",
        "It is Canberra",
    ),
    ("Who wrote it?", "The quick brown fox wrote it.", "fox", "dog", "the lazy dog"),
    ("Where is the Seine?", "The Seine is in Lyon.", "Lyon", "Paris", "I do not know"),
    ("What jumps over the dog?", "The quick brown fox jumps.", "quick", "fox", None),
]


def test_the_script_reports_true_conflicts_with_consistent_figures(tmp_path):
    from fides_rag.eval.closed_book import question_key

    data = tmp_path / "data.jsonl"
    lines = [
        {
            "id": f"c{i}",
            "question": q,
            "contexts": [p],
            "context_answers": [s],
            "memory_answers": [o],
            "original_answers": [o],
        }
        for i, (q, p, s, o, _) in enumerate(ROWS)
    ]
    lines.append(
        {
            "id": "a0",
            "question": ROWS[0][0],
            "contexts": ["Paris is the capital."],
            "context_answers": ["Paris"],
            "original_answers": ["Paris"],
        }
    )
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    closed = tmp_path / "closed_book.jsonl"
    closed.write_text(
        "".join(
            json.dumps(
                {
                    "key": question_key("tiny-llama", q),
                    "model": "tiny-llama",
                    "max_new_tokens": 32,
                    "question": q,
                    "answer": a,
                }
            )
            + "\n"
            for q, _, _, _, a in ROWS
            if a is not None
        )
    )
    config = tmp_path / "calibrated.json"
    config.write_text(json.dumps({"weights": [0.6, 0.3, 0.1], "shift_scale": 0.5, "noise_scale": 2.0}))
    out = tmp_path / "report.json"
    printed = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--tiny",
            "--dataset",
            "jsonl",
            "--data",
            str(data),
            "--closed-book",
            str(closed),
            "--config",
            str(config),
            "--device",
            "cpu",
            "--out",
            str(out),
            "--save-every",
            "2",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    report = json.loads(out.read_text())
    assert report["counts"] == {"rows_read": 6, "swapped": 5, "no_closed_book": 1, "supplied": 1, "true_conflict": 3}
    assert report["columns"] == ["fides", "calibrated"]
    settings = report["settings"]
    assert settings["model"] == "tiny-llama" and settings["closed_book_max_new_tokens"] == 32
    assert settings["data_sha256"] and settings["calibrated_config"]["shift_scale"] == 0.5
    records = report["records"]
    assert [r["id"] for r in records] == ["c0", "c1", "c2"]
    assert [r["same_first_token"] for r in records] == [True, False, False]  # " Ly" / " Par": a lone space first
    assert all(r["position"] == 0 and not r["fallback_tokenisation"] for r in records)
    for r in records:
        assert r["flippable"] == (r["alpha_star"] is not None)
        assert r["already_first"] == (r["context_argmax"] == r["s_token"])
        if r["already_first"]:
            assert r["alpha_star"] == 0.0
        if r["alpha_upper"] is not None:
            assert r["alpha_star"] < r["alpha_upper"]
        for column, alpha_min in (("fides", 0.1), ("calibrated", 0.1)):
            entry = r[column]
            assert entry["alpha"] >= alpha_min - 1e-7
            assert entry["alpha"] == pytest.approx(max(alpha_min, 1.5 * entry["score"]), rel=1e-5)
            assert entry["in_interval"] == entry["ranks_s_first"]
            assert entry["at_least_alpha_star"] == (r["flippable"] and entry["alpha"] >= r["alpha_star"])
    assert records[1]["fides"]["score"] != records[1]["calibrated"]["score"]
    summary = report["summary"]
    assert summary["measured"] == 3 and summary["rows"] == summary["questions"] == 2
    assert summary["same_first_token"] == 1
    flippable = [r for r in records[1:] if r["flippable"]]
    assert summary["share_flippable"] == pytest.approx(len(flippable) / 2)
    assert summary["alpha_star_flippable"]["n"] == len(flippable)
    assert summary["fides"]["alpha"]["n"] == 2 and summary["fides"]["alpha"]["median"] >= 0.1
    assert "| flippable |" in printed and "| calibrated alpha: median" in printed


def test_divergent_measures_the_first_token_where_the_answers_differ():
    from fides_rag import FidesDecoder
    from fides_rag.eval.datasets import QAExample
    from fides_rag.method.lens import ModelAnatomy
    from fides_rag.testing import build_tiny_model, build_tokenizer

    decisive = _script()
    tokenizer = build_tokenizer()
    decoder = FidesDecoder(build_tiny_model("llama", len(tokenizer)), tokenizer)
    anatomy = ModelAnatomy.of(decoder.model)
    example = QAExample(ROWS[0][0], (ROWS[0][1],), ("Lyon",), ("Paris",), id="c0", original_answers=("Paris",))
    rules = decisive.rule_columns(None)
    first = decisive.measure_row(decoder, anatomy, rules, example, "Paris")
    later = decisive.measure_row(decoder, anatomy, rules, example, "Paris", divergent=True)
    assert first["same_first_token"] and first["position"] == 0 and first["forced_prefix"] == ""
    assert not later["same_first_token"] and later["position"] == 1 and later["forced_prefix"] == " "
    assert (tokenizer.decode([later["s_token"]]), tokenizer.decode([later["o_token"]])) == ("Ly", "Par")
    prepared = decoder.prepare(example.question, list(example.contexts), decisive.PROMPT_TOKENS)
    forced = decisive.forward_path(anatomy, [*prepared.context_ids, first["s_token"]], decoder.device, ())
    assert later["context_argmax"] == int(forced.logits.argmax())
    # the teacher-forced pass reads what the decoder decodes: its first greedy token on each path
    assert decoder.generate(prepared, method="standard", max_new_tokens=1).token_ids == [first["context_argmax"]]
    closed_book = decoder.generate(example.question, [], method="standard", max_new_tokens=1)
    assert closed_book.token_ids == [first["no_context_argmax"]]
    assert decisive.decisive_position([5, 6], [5, 6, 7], True) is None
