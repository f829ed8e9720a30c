"""benchmarks/gpu.py runs end to end on the CPU with a tiny configuration: every section is written with sane
values, every request's tokens are the same alone and among the others, and nothing optional (gguf, pandas) is
imported on its path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(400)
def test_the_gpu_benchmark_runs_with_a_tiny_configuration_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu.py",
            "--tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--context-tokens",
            "48",
            "--question-tokens",
            "8",
            "--new-tokens",
            "5",
            "--samples",
            "1",
            "--batch-sizes",
            "1,2",
            "--serving-requests",
            "4",
            "--serving-tokens",
            "2,4",
            "--loads",
            "4,8",
            "--budgets",
            "16,64",
            "--budget-requests",
            "4",
            "--peers",
            "hf-cfg,hf-static-compile",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["config"] == "tiny" and report["config_values"]["num_hidden_layers"] == 2
    assert report["optional_packages_imported"] == []

    assert report["modes"] == ["exact", "fast"]  # both modes on the CPU
    exactness = report["sections"]["exactness"]["modes"]
    exact = exactness["exact"]  # on the CPU in float32 exact mode's contract holds: every request is equal
    assert exact["requests"] == 8 and exact["new_tokens"] == 32
    assert {m: d["equal"] for m, d in exact["methods"].items()} == {"standard": 8, "cad": 8, "fides": 8}
    assert "| fides | 8/8 | - |" in run.stdout
    assert set(exactness["fast"]["methods"]) == {"standard", "cad", "fides"}
    assert "fast mode: greedy tokens alone" in run.stdout

    for latency in report["sections"]["latency"]["modes"].values():
        assert set(latency["methods"]) == {"standard", "cad", "fides", "hf-cfg", "hf-static-compile"}
        for method in latency["methods"].values():
            assert method["decode_ms_per_token"] > 0 and method["first_token_ms"] > 0 and method["ops_per_token"] > 0
            assert method["host_syncs_per_token"] is None  # counted on CUDA only
        for name in ("standard", "cad", "fides"):  # the engine's forward within its step
            engine = latency["methods"][name]
            assert (
                0 < engine["forward_ms_per_token"] < engine["decode_ms_per_token"] and 0 < engine["forward_share"] < 1
            )
        assert latency["methods"]["hf-cfg"]["forward_ms_per_token"] is None
        assert latency["methods"]["cad"]["ops_per_token"] > latency["methods"]["standard"]["ops_per_token"]
        assert latency["memory"]["peak_rss_gib"] > 0
        assert "standard/hf-static-compile" in latency["ratios"]

    for mode, batch in report["sections"]["batch"]["modes"].items():
        for method in ("standard", "fides"):
            assert list(batch[method]) == ["1", "2"]
            assert all(size["decode_ms_per_step"] > 0 and size["tokens_per_s"] > 0 for size in batch[method].values())
            one, two = batch[method]["1"]["ops_per_step"], batch[method]["2"]["ops_per_step"]
            assert one > 0 and two > 0
            if mode == "fast":  # one attention call per layer: the ops of a step stay flat in the requests
                assert two <= 1.3 * one
            else:  # exact mode attends each group of rows on its own
                assert two > one

    serving = report["sections"]["serving"]
    assert list(serving["loads"]) == ["4.0", "8.0"]
    for load in serving["loads"].values():
        assert set(load["modes"]) == {"continuous", "static"}
        assert isinstance(load["identical_outputs"], bool)
        for mode in load["modes"].values():
            assert (
                mode["latency_s"]["p95"] >= mode["ttft_s"]["p50"] > 0
                and mode["tokens"]
                and all(2 <= t <= 4 for t in mode["tokens"])
            )
    sweep = report["sections"]["budget"]
    assert list(sweep["budgets"]) == ["16", "64"] and sweep["load"] == 2.0 and sweep["requests"] == 4
    assert all(d["latency_s"]["p95"] >= d["ttft_s"]["p50"] > 0 for d in sweep["budgets"].values())
    assert "| max_num_batched_tokens |" in run.stdout
    assert "| method | decode ms/token |" in run.stdout and "continuous / static" in run.stdout


SMALL = [
    "--new-tokens",
    "4",
    "--counted-steps",
    "1",
    "--samples",
    "1",
    "--exact-requests",
    "2",
    "--exact-tokens",
    "3",
    "--batch-sizes",
    "1,2",
    "--serving-requests",
    "4",
    "--serving-tokens",
    "2,3",
    "--loads",
    "4",
    "--budgets",
    "2048",
    "--budget-requests",
    "4",
    "--attention-repeats",
    "2",
    "--peers",
    "hf-cfg",
]
"""Everything small but the context length (the default, 2,048 tokens)."""


def _gpu_call(tmp_path, *flags):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu.py",
            "--tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            *SMALL,
            *flags,
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text()), run.stdout


@pytest.mark.timeout(400)
def test_the_gpu_call_runs_on_cpu_at_the_default_context_length_correctness_first(tmp_path):
    report, stdout = _gpu_call(tmp_path, "--call", "1")
    assert list(report["sections"]) == ["correctness", "default", "attention", "floor", "latency", "batch", "serving"]
    assert report["modes"] == ["exact", "fast"] and report["settings"]["context_tokens"] == 2048
    assert report["torch"] == torch.__version__ and report["transformers"] and report["compile"]["enabled"] is False
    correctness = report["sections"]["correctness"]
    assert correctness["attention"] == "gather" and correctness["failed_requests"] == 0
    # float32 on the CPU: the engine and transformers' generate both give the teacher-forced reference's argmax
    assert correctness["engine"]["tokens"] == 4 * 32 and correctness["engine"]["top1_agreement"] == 1.0
    assert correctness["hf-generate"]["top1_agreement"] == 1.0
    assert correctness["max_abs_logprob_difference"] < 1e-3
    default = report["sections"]["default"]
    assert list(default["rows"]) == ["1", "2", "3", "5", "9", "17", "33"] and default["failed_requests"] == 0
    assert report["sections"]["floor"]["read_ms"] > 0
    cases = report["sections"]["attention"]["cases"]
    assert list(cases) == ["R=1,P=512", "R=8,P=512", "R=1,P=4096", "R=8,P=4096"]
    assert cases["R=1,P=4096"]["row_positions"] == [2048]  # one short row in the largest pool
    assert all(c["whole_pool_ms"] > 0 and c["block_ms"] > 0 and c["max_abs_difference"] < 1e-4 for c in cases.values())
    assert all(c["flex_max_abs_difference"] < 1e-4 for c in cases.values())
    assert "| rows | pool positions | whole-pool masked ms |" in stdout and "Correctness (gather attention)" in stdout
    assert report["compile_log"]["cudagraphs_skipped"] is False and isinstance(report["compile_log"]["lines"], list)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_the_exactness_and_budget_sections_run_on_cpu_at_the_default_context_length(tmp_path, mode):
    report, _ = _gpu_call(tmp_path, "--sections", "exactness,budget", "--modes", mode)
    assert list(report["sections"]) == ["exactness", "budget"] and report["modes"] == [mode]
    assert set(report["sections"]["exactness"]["modes"]) == {mode}


def test_compile_is_off_by_default_as_for_a_user_and_bad_attention_sizes_are_refused(capsys):
    gpu = _import_gpu()
    args = gpu.parse(["--out", "x.json", "--tiny"])
    assert args.compile is False and args.attention == "auto"
    assert args.buckets == [1, 2, 4, 8, 16, 32, 64] and args.attention_rows == [1, 8]
    assert gpu.parse(["--out", "x.json", "--no-compile", "--kv-pool-tokens", "8192"]).compile is False
    assert gpu.parse(["--out", "x.json"]).attention_positions == [4096, 262144]
    with pytest.raises(SystemExit):
        gpu.parse(["--out", "x.json", "--buckets", "4,2"])
    assert "--buckets must be strictly increasing" in capsys.readouterr().err


def _import_gpu():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return gpu


def test_the_gpu_call_checks_before_it_times_and_a_call_excludes_sections(capsys):
    gpu = _import_gpu()
    sections = gpu.parse(["--out", "x.json", "--call", "1"]).sections
    assert sections[:2] == ["correctness", "default"] and "exactness" not in sections
    with pytest.raises(SystemExit):
        gpu.parse(["--out", "x.json", "--call", "1", "--sections", "batch"])
    assert "give --call or --sections, not both" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--serving-requests", "--budget-requests"])
def test_fewer_than_four_requests_is_refused_before_the_model_is_built(flag, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    with pytest.raises(SystemExit):
        gpu.parse(["--out", "unused.json", flag, "3"])
    assert "must be at least 4" in capsys.readouterr().err


def test_the_first_differing_token_is_where_two_answers_part_or_where_the_shorter_ends():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert gpu.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert gpu.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert gpu.first_difference([1, 2], [1, 2, 3]) == 2


@pytest.mark.parametrize("flag", ["--exact-requests", "--exact-tokens"])
def test_an_exactness_run_of_nothing_is_refused_before_the_model_is_built(flag, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    with pytest.raises(SystemExit):
        gpu.parse(["--out", "unused.json", flag, "0"])
    assert "must be at least 1" in capsys.readouterr().err
