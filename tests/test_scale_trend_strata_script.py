"""benchmarks/scale_trend.py --strata: the strata figures per backbone as JSON, the true-conflict targets, and a clear
error (never invented numbers) when no strata results exist."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fides_rag.eval.datasets import data_dir
from fides_rag.eval.metrics import score_prediction
from fides_rag.eval.strata import STRATA, summarize_strata

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "scale_trend.py"
RUNS = {
    "SmolLM2-135M-Instruct": "smollm2-nqswap-strata",
    "gemma3-270m": "gemma3-nqswap-strata",
    "Qwen2.5-Coder-0.5B-Instruct": "qwen05-nqswap-strata",
    "Qwen2.5-Coder-1.5B-Instruct": "qwen15-nqswap-strata",
}


def _entry(n, score, regressions=0, fixes=0, ci=None, standard_right=0):
    return {
        "n": n,
        "metric": "cf",
        "score": score,
        "regressions": regressions,
        "fixes": fixes,
        "ci_vs_standard": ci,
        "diff_vs_standard": None,
        "standard_right": standard_right,
    }


def _strata(tc_fides_ci, agreeing_regressions=0, tc_n=300, available=400):
    return {
        "available": {"true_conflict": available},
        "seed": 0,
        "per_stratum": 300,
        "results": {
            "true_conflict": {
                "standard": _entry(tc_n, 20.0),
                "fides": _entry(tc_n, 30.0, 5, 35, tc_fides_ci),
                "fides+nwcad": _entry(tc_n, 25.0, 2, 17, [-1.0, 9.0]),
            },
            "supplied": {"standard": _entry(300, 80.0), "fides": _entry(300, 85.0, 1, 16, [1.0, 9.0])},
            "known_agreeing": {
                "standard": _entry(200, 90.0, standard_right=180),
                "fides": _entry(200, 85.0, 20, 10, [-8.0, -2.0], 180),
                "fides+nwcad": _entry(200, 89.5, agreeing_regressions, 2, [-2.0, 1.0], 180),
            },
            "unknown_agreeing": {"standard": _entry(100, 40.0), "fides": _entry(100, 42.0, 3, 5, [-2.0, 6.0])},
        },
    }


def _write(root: Path, run: str, results: dict) -> None:
    (root / run).mkdir(parents=True)
    (root / run / "results.json").write_text(json.dumps(results))


def _run(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(root), *args], check=check, capture_output=True, text=True
    )


def test_no_strata_results_is_an_error_naming_the_command(tmp_path):
    for args in (["--strata", "--json"], ["--strata", "--targets"]):
        done = _run(tmp_path, *args, check=False)
        assert done.returncode == 2 and done.stdout == ""
        assert "no strata results" in done.stderr and "fides-rag eval" in done.stderr and "--strata" in done.stderr


def test_results_written_without_strata_are_refused(tmp_path):
    _write(tmp_path, "qwen05-nqswap-strata", {"run": {"examples": 10}, "metrics": {}, "significance": [], "labels": []})
    done = _run(tmp_path, "--strata", "--json", check=False)
    assert done.returncode == 2 and "holds no strata results" in done.stderr


def test_json_gives_every_backbone_stratum_and_method_with_its_ci(tmp_path):
    for run in RUNS.values():
        _write(tmp_path, run, {"strata": _strata([2.0, 18.0], agreeing_regressions=4)})
    out = json.loads(_run(tmp_path, "--strata", "--json").stdout)
    assert set(out["backbones"]) == set(RUNS)
    qwen = out["backbones"]["Qwen2.5-Coder-0.5B-Instruct"]
    assert qwen["true_conflict_available"] == 400
    assert qwen["strata"]["true_conflict"]["fides"] == {
        "n": 300,
        "questions": None,  # results.json without them, and no run folder to read them again from
        "score": 30.0,
        "regressions": 5,
        "fixes": 35,
        "ci_vs_standard": [2.0, 18.0],
        "failures": None,
    }
    assert set(qwen["strata"]) == {"true_conflict", "supplied", "known_agreeing", "unknown_agreeing"}
    assert out["recommended"] == "fides+nwcad"  # harmless on known-agreeing rows (4 <= 3% of 180), FIDES is not
    assert json.loads(_run(tmp_path, "--strata", "--json", "--recommended", "fides").stdout)["recommended"] == "fides"


def test_targets_hold_when_fides_wins_on_three_backbones_and_the_variant_is_harmless(tmp_path):
    cis = [[2.0, 18.0], [0.5, 10.0], [1.0, 12.0], [-3.0, 9.0]]
    for run, ci in zip(RUNS.values(), cis):
        _write(tmp_path, run, {"strata": _strata(ci, agreeing_regressions=4)})
    text = _run(tmp_path, "--strata", "--targets").stdout
    assert "Recommended variant: fides+nwcad" in text
    assert "on ≥ 3 of 4 backbones: held (3)" in text
    assert "on every backbone: held (4 of 4)" in text.splitlines()[-1]
    assert "true-conflict rows ≥ 300 (or all available) on every backbone: held (4 of 4)" in text


def test_targets_fail_on_too_few_rows_few_wins_and_regressions(tmp_path):
    for run in list(RUNS.values())[:2]:
        _write(tmp_path, run, {"strata": _strata([-1.0, 5.0], agreeing_regressions=6, tc_n=120, available=400)})
    text = _run(tmp_path, "--strata", "--targets", "--recommended", "fides+nwcad").stdout
    assert "held (0 of 4)" in text and ": not held (0)" in text
    assert text.splitlines()[-1].endswith("not held (0 of 4)")  # 6 regressions > 3% of 180
    assert "| Qwen2.5-Coder-0.5B-Instruct (0.5B) | not run |" in text


def test_the_headline_gives_each_backbones_true_conflict_cf_and_known_agreeing_em_with_regressions(tmp_path):
    _write(tmp_path, "gemma3-nqswap-strata", {"strata": _strata([1.0, 4.0], agreeing_regressions=4, tc_n=42)})
    text = _run(tmp_path, "--strata", "--headline").stdout
    head = text.splitlines()[0]
    assert head.startswith("| backbone | true-conflict n | CF standard | CF AdaCAD | CF FIDES | CF fides+nwcad |")
    row = "| gemma3-270m (270M) | 42 of 400 | 20.0 | – | 30.0 (5) | 25.0 (2) | 200 | 90.0 | – | 85.0 (20) | 89.5 (4) |"
    assert row in text
    assert "| SmolLM2-135M-Instruct (135M) | not run |" in text
    assert _run(tmp_path, "--headline", check=False).returncode == 2  # the headline is the strata one


def test_all_available_true_conflict_rows_count_as_enough(tmp_path):
    _write(tmp_path, "gemma3-nqswap-strata", {"strata": _strata([1.0, 4.0], tc_n=42, available=42)})
    text = _run(tmp_path, "--strata", "--targets").stdout
    assert "| gemma3-270m (270M) | 42 / 42 | yes |" in text


def test_reads_what_the_harness_writes(tmp_path):
    def record(i, standard, fides):
        scores = {t: score_prediction(t, ["Lyon"], ["Paris"]) for t in (standard, fides)}
        return {
            "id": f"r{i}",
            "question": f"q{i}",
            "outputs": {
                "standard": {"method": "standard", "steps": [{}], "scores": scores[standard], "text": standard},
                "fides": {"method": "fides", "steps": [{}], "scores": scores[fides], "text": fides},
            },
        }

    records = [record(i, "Paris", "Lyon") for i in range(6)] + [record(6, "Lyon", "Lyon")]
    summary = summarize_strata(records, {r["id"]: "true_conflict" for r in records}, ["standard", "fides"], samples=50)
    _write(tmp_path, "smollm2-nqswap-strata", {"strata": {"available": {"true_conflict": 7}, "results": summary}})
    out = json.loads(_run(tmp_path, "--strata", "--json").stdout)
    fides = out["backbones"]["SmolLM2-135M-Instruct"]["strata"]["true_conflict"]["fides"]
    assert fides["n"] == 7 and fides["fixes"] == 6 and fides["regressions"] == 0 and fides["ci_vs_standard"][0] > 0
    assert (
        out["backbones"]["SmolLM2-135M-Instruct"]["strata"]["supplied"]["fides"]["n"] == 0
    )  # an empty stratum: n 0, no score
    assert out["backbones"]["SmolLM2-135M-Instruct"]["strata"]["supplied"]["fides"]["score"] is None


def test_the_readmes_table_is_the_headline_of_the_committed_results():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- strata-headline -->\n")[1].split("<!-- /strata-headline -->")[0]
    assert block.strip() == _run(ROOT / "results" / "eval", "--strata", "--headline").stdout.strip()


CLASSES = {"memorised", "no_stop", "other_span", "other"}


def test_bigbench_conflicts_reads_its_own_runs_with_questions_and_failure_classes(tmp_path):
    strata = _strata([2.0, 18.0])
    failures = {"memorised": 40, "no_stop": 10, "other_span": 25, "other": 5}
    strata["results"]["true_conflict"]["standard"] |= {"questions": 300, "failures": failures}
    _write(tmp_path, "gemma3-bigbench-strata", {"strata": strata})
    _write(tmp_path, "qwen05-nqswap-strata", {"strata": _strata([-5.0, -1.0])})  # another dataset's run: not read
    out = json.loads(_run(tmp_path, "--strata", "--json", "--dataset", "bigbench-conflicts").stdout)
    assert set(out) == {"recommended", "backbones"} and set(out["backbones"]) == {"gemma3-270m"}
    standard = out["backbones"]["gemma3-270m"]["strata"]["true_conflict"]["standard"]
    assert list(standard)[:2] == ["n", "questions"] and standard["questions"] == 300
    assert standard["failures"] == failures and set(standard["failures"]) == CLASSES


def test_bigbench_conflicts_without_runs_names_its_command_and_needs_strata(tmp_path):
    done = _run(tmp_path, "--strata", "--json", "--dataset", "bigbench-conflicts", check=False)
    assert done.returncode == 2 and "--dataset bigbench-conflicts-both" in done.stderr
    assert "smollm2-bigbench-strata" in done.stderr
    done = _run(tmp_path, "--dataset", "bigbench-conflicts", check=False)
    assert done.returncode == 2 and "need --strata" in done.stderr


def test_results_without_questions_or_failure_classes_get_them_from_the_run_folder(write_strata_run, tmp_path):
    records = write_strata_run(tmp_path / "smollm2-nqswap-strata")
    strata = {r["id"]: s for r, s in zip(records, ["true_conflict", "known_agreeing", "supplied", "unknown_agreeing"])}
    summary = summarize_strata(records, strata, ["standard", "fides"], samples=20)
    for methods in summary.values():
        for entry in methods.values():
            del entry["questions"], entry["failures"]  # as results written before they were counted
    (tmp_path / "smollm2-nqswap-strata" / "results.json").write_text(json.dumps({"strata": {"results": summary}}))
    out = json.loads(_run(tmp_path, "--strata", "--json").stdout)["backbones"]["SmolLM2-135M-Instruct"]["strata"]
    assert out["true_conflict"]["standard"]["questions"] == 1
    assert out["true_conflict"]["standard"]["failures"] == {"memorised": 1, "no_stop": 0, "other_span": 0, "other": 0}
    assert out["supplied"]["fides"]["failures"] == {"memorised": 0, "no_stop": 1, "other_span": 0, "other": 0}


@pytest.mark.skipif(not (data_dir() / "nq_swap").is_dir(), reason="needs the NQ-Swap data of ../shared/data")
def test_the_committed_nq_swap_runs_give_questions_and_failure_classes_in_every_cell():
    out = json.loads(_run(ROOT / "results" / "eval", "--strata", "--json").stdout)
    assert set(out["backbones"]) == set(RUNS)
    for backbone in out["backbones"].values():
        for stratum in STRATA:
            for cell in backbone["strata"][stratum].values():
                assert 0 < cell["questions"] <= cell["n"] and set(cell["failures"]) == CLASSES
                right = cell["n"] - sum(cell["failures"].values())
                assert abs(right - cell["score"] * cell["n"] / 100) < 1e-6  # right answers are the score's
