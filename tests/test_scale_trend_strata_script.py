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


def _bigbench_strata(methods, tc_questions=100):
    failures = {"memorised": 30, "no_stop": 20, "other_span": 15, "other": 5}

    def cell(n, questions, score, regressions=0):
        return _entry(n, score, regressions, ci=[-1.0, 2.0]) | {"questions": questions, "failures": failures}

    return {
        "available": {"true_conflict": 412},
        "results": {
            "true_conflict": {m: cell(100, tc_questions, 30.0 + i, i) for i, m in enumerate(methods)},
            "supplied": {m: cell(50, 50, 10.0) for m in methods},
            "known_agreeing": {m: cell(100, 99, 70.0 - i, 2 * i) for i, m in enumerate(methods)},
            "unknown_agreeing": {m: cell(50, 48, 5.0) for m in methods},
        },
    }


def test_the_bigbench_headline_shows_the_methods_its_runs_hold_with_rows_and_questions(tmp_path):
    _write(
        tmp_path,
        "gemma3-bigbench-strata",
        {"strata": _bigbench_strata(["fides-calibrated", "standard", "fides-stop", "fides"], tc_questions=97)},
    )
    _write(tmp_path, "qwen05-bigbench-strata", {"strata": _bigbench_strata(["standard", "adacad", "fides"])})
    _write(tmp_path, "qwen15-nqswap-strata", {"strata": _strata([2.0, 18.0])})  # NQ-Swap's: not read
    text = _run(tmp_path, "--strata", "--headline", "--dataset", "bigbench-conflicts").stdout
    head = text.splitlines()[0]
    methods = ["standard", "AdaCAD", "FIDES", "fides-stop", "fides-calibrated"]
    columns = ["backbone", "true-conflict n (questions)", *[f"CF {m}" for m in methods]]
    columns += ["known-agreeing n (questions)", *[f"EM {m}" for m in methods]]
    assert head == "| " + " | ".join(columns) + " |"
    # the run's order: fides-calibrated 0, standard 1, fides-stop 2, fides 3 (score 30 + i, regressions i)
    gemma = "| gemma3-270m (270M) | 100 (97 q) of 412 | 31.0 | – | 33.0 (3) | 32.0 (2) | 30.0 (0) | 100 (99 q) | 69.0 |"
    assert gemma + " – | 67.0 (6) | 68.0 (4) | 70.0 (0) |" in text
    assert "| Qwen2.5-Coder-0.5B-Instruct (0.5B) | 100 (100 q) of 412 | 30.0 | 31.0 (1) | 32.0 (2) | – | – |" in text
    assert "| Qwen2.5-Coder-1.5B-Instruct (1.5B) | not run | – | – | – | – | – | not run |" in text
    assert "| SmolLM2-135M-Instruct (135M) | not run |" in text


def test_the_bigbench_headline_adds_the_recommended_variant_and_lists_every_backbone_before_any_run(tmp_path):
    empty = _run(tmp_path, "--strata", "--headline", "--dataset", "bigbench-conflicts")
    assert empty.stdout.splitlines()[0] == "| backbone | true-conflict n (questions) | known-agreeing n (questions) |"
    assert empty.stdout.count("| not run | not run |") == 4  # no run yet: every backbone not run, no number
    _write(tmp_path, "gemma3-bigbench-strata", {"strata": _bigbench_strata(["standard", "fides", "fides+nwcad"])})
    text = _run(tmp_path, "--strata", "--headline", "--dataset", "bigbench-conflicts").stdout
    assert "| CF standard | CF FIDES | CF fides+nwcad | known-agreeing" in text.splitlines()[0]
    text = _run(tmp_path, "--strata", "--headline", "--dataset", "bigbench-conflicts", "--recommended", "fides").stdout
    assert "| CF standard | CF FIDES | known-agreeing" in text.splitlines()[0]  # fides+nwcad: neither listed nor chosen
    _write(tmp_path, "qwen05-bigbench-strata", {"run": {"examples": 1}, "metrics": {}, "significance": []})
    done = _run(tmp_path, "--strata", "--headline", "--dataset", "bigbench-conflicts", check=False)
    assert done.returncode == 2 and "holds no strata results" in done.stderr  # refused, never shown as not run


def test_failures_gives_the_wrong_answers_by_class_per_backbone_stratum_and_method(tmp_path):
    _write(tmp_path, "gemma3-bigbench-strata", {"strata": _bigbench_strata(["fides", "standard"])})
    text = _run(tmp_path, "--strata", "--failures", "--dataset", "bigbench-conflicts").stdout
    lines = text.splitlines()
    assert lines[0] == (
        "| backbone | stratum | method | rows (questions) | score | wrong | memorised | no_stop | other_span | other |"
    )
    assert "| gemma3-270m (270M) | true_conflict | standard | 100 (100 q) | 31.0 | 70 | 30 | 20 | 15 | 5 |" in lines
    assert "|  |  | fides | 100 (100 q) | 30.0 | 70 | 30 | 20 | 15 | 5 |" in lines
    assert "|  | known_agreeing | standard | 100 (99 q) | 69.0 | 70 | 30 | 20 | 15 | 5 |" in lines
    assert "| SmolLM2-135M-Instruct (135M) | not run | – | – | – | – | – | – | – | – |" in lines
    assert len(lines) == 2 + 3 + 4 * 2  # three backbones not run, gemma3's 4 strata x 2 methods
    _write(tmp_path, "qwen05-nqswap-strata", {"strata": _strata([2.0, 18.0])})  # no classes, no run folder to read
    nq = _run(tmp_path, "--strata", "--failures").stdout
    assert "| Qwen2.5-Coder-0.5B-Instruct (0.5B) | true_conflict | standard | 300 | 20.0 | – | – | – | – | – |" in nq
    assert _run(tmp_path, "--failures", check=False).returncode == 2  # needs --strata


def _bigbench_targets_strata(stop_no_stop, tc_ci, regressions=0, scanned=5000):
    """BIG-bench strata with standard, FIDES (5 answers that do not stop per stratum), fides-stop and
    fides+evidence, the scan having read `scanned` of 14,021 questions."""
    strata = _bigbench_strata(["standard", "fides", "fides-stop", "fides+evidence"])
    for cells in strata["results"].values():
        for method, no_stop in (("fides", 5), ("fides-stop", stop_no_stop)):
            cells[method]["failures"] = {"memorised": 0, "no_stop": no_stop, "other_span": 0, "other": 0}
    strata["results"]["true_conflict"]["fides-stop"]["ci_vs_standard"] = tc_ci
    strata["results"]["known_agreeing"]["fides+evidence"] |= {"score": 70.0, "regressions": regressions}
    strata["results"]["known_agreeing"]["standard"] |= {"score": 70.0, "standard_right": 70}
    strata["available"] = {"true_conflict": 100}
    return strata | {"questions": 14021, "scanned_questions": scanned}


def test_bigbench_targets_count_the_three_backbones_any_winning_variant_and_the_stop_variants_no_stop(tmp_path):
    _write(tmp_path, "gemma3-bigbench-strata", {"strata": _bigbench_targets_strata(6, [2.0, 9.0])})
    _write(tmp_path, "qwen05-bigbench-strata", {"strata": _bigbench_targets_strata(1, [-4.0, 3.0])})
    _write(tmp_path, "qwen15-bigbench-strata", {"strata": _bigbench_targets_strata(1, [0.5, 7.0], regressions=3)})
    text = _run(
        tmp_path, "--strata", "--targets", "--dataset", "bigbench-conflicts", "--recommended", "fides+evidence"
    ).stdout
    lines = text.splitlines()
    assert lines[0] == "Recommended variant: fides+evidence"
    assert "| SmolLM2-135M-Instruct (135M) (not counted) | not run |" in text
    # 4 strata: fides-stop 24 answers that do not stop against FIDES's 20 on gemma3, 4 of 20 on the Qwen backbones
    gemma = "| gemma3-270m (270M) | 100 / 100 | no | fides-stop [+2.0, +9.0] | yes | 70.0 / 70.0, 0 / 70 | yes |"
    assert gemma + " 24 / 20 | no |" in lines
    assert "| 100 / 100 | no | fides [-1.0, +2.0] | no |" in text  # 0.5B: FIDES's CI [-1, 2] beats fides-stop's
    assert "70.0 / 70.0, 3 / 70 | no | 4 / 20 | yes |" in text  # 1.5B: 3 regressions > 3% of 70
    assert "- true-conflict rows ≥ 300 (or all available) on every backbone: not held (0 of 3)" in lines
    assert "- a method beats standard on true-conflict CF with the CI above 0 on ≥ 2 of 3 backbones: held (2)" in lines
    stop = "- fides-stop's answers that do not stop at most 1/3 of FIDES's, on every backbone: not held (2 of 3)"
    assert stop in lines
    assert lines[-1].endswith("on every backbone: not held (2 of 3)")


def test_bigbench_targets_count_all_available_rows_only_where_the_scan_read_every_question(tmp_path):
    _write(tmp_path, "gemma3-bigbench-strata", {"strata": _bigbench_targets_strata(1, [2.0, 9.0], scanned=14021)})
    _write(tmp_path, "qwen05-bigbench-strata", {"strata": _bigbench_targets_strata(1, [2.0, 9.0], scanned=9000)})
    text = _run(tmp_path, "--strata", "--targets", "--dataset", "bigbench-conflicts").stdout
    assert "| gemma3-270m (270M) | 100 / 100 | yes |" in text
    assert "| Qwen2.5-Coder-0.5B-Instruct (0.5B) | 100 / 100 | no |" in text  # the scan stopped: more may exist


def test_the_readmes_bigbench_table_is_the_bigbench_headline_of_the_committed_results():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- strata-headline-bigbench -->\n")[1].split("<!-- /strata-headline-bigbench -->")[0]
    made = _run(ROOT / "results" / "eval", "--strata", "--headline", "--dataset", "bigbench-conflicts").stdout
    assert block.strip() == made.strip()


def test_the_results_pages_bigbench_tables_are_the_scripts_output_on_the_committed_results():
    page = (ROOT / "docs" / "results.md").read_text()
    blocks = (
        ("strata-headline-bigbench", "--headline"),
        ("strata-failures-bigbench", "--failures"),
        ("strata-targets-bigbench", "--targets"),
    )
    for marker, mode in blocks:
        block = page.split(f"<!-- {marker} -->\n")[1].split(f"<!-- /{marker} -->")[0]
        made = _run(ROOT / "results" / "eval", "--strata", mode, "--dataset", "bigbench-conflicts").stdout
        assert block.strip() == made.strip(), marker


def test_into_replaces_the_marked_block_and_nothing_else(tmp_path):
    _write(tmp_path, "gemma3-bigbench-strata", {"strata": _bigbench_strata(["standard", "fides"])})
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- t -->\nold table\n<!-- /t -->\nafter\n")
    args = ("--strata", "--headline", "--dataset", "bigbench-conflicts")
    done = _run(tmp_path, *args, "--into", str(page), "--marker", "t")
    assert done.stdout == ""
    made = _run(tmp_path, *args).stdout
    assert page.read_text() == f"intro\n<!-- t -->\n{made}<!-- /t -->\nafter\n"
    missing = _run(tmp_path, *args, "--into", str(page), "--marker", "u", check=False)
    assert missing.returncode != 0 and "no single block" in missing.stderr
    assert _run(tmp_path, *args, "--into", str(page), check=False).returncode == 2  # --marker goes with it
