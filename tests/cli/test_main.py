from __future__ import annotations

import json

import pytest

import fides_rag.cli.main as cli
from fides_rag.testing import build_tiny_model


@pytest.fixture
def tiny_folder(tmp_path, tokenizer):
    model = build_tiny_model("llama", len(tokenizer))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_methods_lists_builtins_and_the_gates(capsys):
    assert cli.main(["methods"]) == 0
    out = capsys.readouterr().out
    assert out.split()[:4] == ["standard", "cad", "adacad", "fides"] and "none, agree, nwcad" in out


def test_a_bad_gate_is_rejected_naming_the_gates(capsys):
    with pytest.raises(SystemExit):
        cli.main(["eval", "--methods", "standard,fides+nope"])
    assert "unknown gate 'nope' in method 'fides+nope'; available gates: none, agree, nwcad" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["generate", "Q?", "--methods", "standard+agree"])
    assert "'standard' has nothing to gate" in capsys.readouterr().err


def test_generate_prints_each_method_and_steps(tiny_folder, capsys):
    code = cli.main(
        [
            "generate",
            "Which city?",
            "--doc",
            "Lyon is the capital.",
            "--model",
            str(tiny_folder),
            "--methods",
            "standard,fides",
            "--max-new-tokens",
            "3",
            "--steps",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "standard:" in out and "fides:" in out and "alpha" in out


def test_generate_json_lines(tiny_folder, capsys):
    cli.main(
        [
            "generate",
            "Which city?",
            "--doc",
            "Lyon.",
            "--model",
            str(tiny_folder),
            "--methods",
            "cad",
            "--max-new-tokens",
            "2",
            "--json",
        ]
    )
    record = json.loads(capsys.readouterr().out.strip())
    assert record["method"] == "cad" and len(record["steps"]) == len(record["token_ids"])


def test_unknown_method_is_rejected(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "Q?", "--methods", "standard,nope"])
    assert "unknown method(s) nope; available methods: standard, cad" in capsys.readouterr().err


# -- calibrate ------------------------------------------------------------------------------------------

CALIBRATION_RECORDS = [
    ("What is the capital of France?", ["Lyon is the capital of France."]),
    ("Who chose Canberra?", ["The capital of Australia is Melbourne.", "Canberra was chosen as a compromise."]),
    ("What jumps?", ["The quick brown fox jumps over the lazy dog."]),
    ("Where is Paris?", ["Paris is a large city on the Seine."]),
    ("What is the capital of Australia?", ["The capital of Australia is Melbourne."]),
    ("Which city is on the Seine?", ["Paris is a large city on the Seine."]),
]


def write_pool(path, answers=("Lyon", "Paris")):
    with path.open("w") as handle:
        for i, (question, contexts) in enumerate(CALIBRATION_RECORDS):
            record = {
                "id": f"q{i}",
                "question": question,
                "contexts": contexts,
                "context_answers": [f"{answers[0]} {i}"],
                "memory_answers": [f"{answers[1]} {i}"],
            }
            handle.write(json.dumps(record) + "\n")
    return path


def calibrate_args(model, data, out, *extra):
    return [
        "calibrate",
        "--model",
        str(model),
        "--dataset",
        "jsonl",
        "--data",
        str(data),
        "--n",
        "4",
        "--offset",
        "1",
        "--max-new-tokens",
        "4",
        "--batch-size",
        "2",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def test_calibrate_writes_a_config_that_generate_and_eval_accept(tiny_folder, tmp_path, capsys):
    from fides_rag import FidesConfig

    data = write_pool(tmp_path / "pool.jsonl")
    out = tmp_path / "runs" / "calibrated.json"
    assert cli.main(calibrate_args(tiny_folder, data, out)) == 0
    printed = capsys.readouterr().out
    assert "0.533, 0.278, 0.189" in printed and "| Opposition" in printed and str(out) in printed
    cfg = FidesConfig.from_file(out)
    assert sum(cfg.weights) == pytest.approx(1.0)
    src = cfg.source
    assert (src["n"], src["offset"], src["examples"], src["first_id"], src["last_id"]) == (4, 1, 4, "q1", "q4")
    assert src["model"] == str(tiny_folder) and src["dataset"] == "jsonl" and src["max_new_tokens"] == 4
    assert (tmp_path / "runs" / "calibrated.md").read_text().startswith("# FIDES calibration")

    assert (
        cli.main(
            [
                "generate",
                "Which city?",
                "--doc",
                "Lyon.",
                "--model",
                str(tiny_folder),
                "--config",
                str(out),
                "--max-new-tokens",
                "2",
                "--json",
            ]
        )
        == 0
    )
    record = json.loads(capsys.readouterr().out.strip())
    assert record["method_options"]["weights"] == list(cfg.weights)
    assert record["method_options"]["noise_scale"] == cfg.noise_scale
    run = tmp_path / "eval"
    assert (
        cli.main(
            [
                "eval",
                "--model",
                str(tiny_folder),
                "--dataset",
                "jsonl",
                "--data",
                str(data),
                "--methods",
                "fides",
                "--limit",
                "2",
                "--out",
                str(run),
                "--config",
                str(out),
                "--max-new-tokens",
                "2",
                "--bootstrap",
                "10",
                "--no-progress",
            ]
        )
        == 0
    )
    assert json.loads((run / "run.json").read_text())["config"]["shift_scale"] == cfg.shift_scale


def test_calibrate_never_reads_answers(tiny_folder, tmp_path):
    from fides_rag import FidesConfig

    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert cli.main(calibrate_args(tiny_folder, write_pool(tmp_path / "a.jsonl"), first)) == 0
    assert cli.main(calibrate_args(tiny_folder, write_pool(tmp_path / "b.jsonl", answers=("zzz", "qqq")), second)) == 0
    a, b = FidesConfig.from_file(first).to_dict(), FidesConfig.from_file(second).to_dict()
    for cfg in (a, b):
        cfg["source"].pop("date")
        cfg["source"].pop("data")
    assert a == b


def test_calibrate_gate_writes_a_threshold_that_generate_gates_with(tiny_folder, tmp_path, capsys):
    from fides_rag import FidesConfig

    data = write_pool(tmp_path / "pool.jsonl")
    base = FidesConfig(lambda_=1.0).to_file(tmp_path / "base.json")
    out = tmp_path / "gated.json"
    extra = ("--gate", "evidence", "--target-share", "0.25", "--config", str(base))
    assert cli.main(calibrate_args(tiny_folder, data, out, *extra)) == 0
    printed = capsys.readouterr().out
    assert "| evidence | tau |" in printed and "fides+evidence" in printed
    cfg = FidesConfig.from_file(out)
    tau = cfg.gates["evidence"]["tau"]
    assert cfg.lambda_ == 1.0 and cfg.source["gates"]["evidence"]["target_share"] == 0.25
    generate = ["generate", "Which city?", "--doc", "Lyon.", "--model", str(tiny_folder), "--max-new-tokens", "2"]
    assert cli.main([*generate, "--methods", "fides+evidence", "--config", str(out), "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip())
    assert record["method_options"]["gate_options"] == {"tau": tau}
    # A calibrated gate's lane joins a run made with the default config: the thresholds are the gated method's options.
    run = tmp_path / "eval"
    evaluate = ["eval", "--model", str(tiny_folder), "--dataset", "jsonl", "--data", str(data), "--limit", "2"]
    evaluate += ["--out", str(run), "--max-new-tokens", "2", "--bootstrap", "10", "--no-progress"]
    assert cli.main([*evaluate, "--methods", "standard,fides", "--config", str(base)]) == 0
    assert cli.main([*evaluate, "--methods", "standard,fides,fides+evidence", "--config", str(out)]) == 0
    info = json.loads((run / "run.json").read_text())
    assert "gates" not in info["config"] and info["config"]["lambda_"] == 1.0
    assert info["method_options"]["fides+evidence"]["options"]["gate_options"] == {"tau": tau}


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--gate", "agree"), "the gate 'agree' has no threshold to calibrate; gates that have one: blend, evidence"),
        (("--gate", "evidence", "--target-share", "1.5"), "target_share must be a number strictly between 0 and 1"),
        (("--target-share", "0.2"), "--target-share and --config go with --gate"),
        (("--gate", "evidence", "--target-share", "0.01"), "cannot hold a share of 0.01"),
    ],
)
def test_calibrate_gate_bad_input_is_one_line_and_writes_nothing(tiny_folder, tmp_path, capsys, extra, message):
    data = write_pool(tmp_path / "pool.jsonl")
    out = tmp_path / "gated.json"
    assert cli.main(calibrate_args(tiny_folder, data, out, *extra)) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not out.with_suffix(".md").exists()


def test_calibrate_argument_errors(capsys):
    with pytest.raises(SystemExit):
        cli.main(["calibrate", "--model", "m", "--n", "1"])
    assert "--n: must be at least 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["calibrate", "--model", "m", "--n", "4", "--offset", "-1"])
    assert "--offset: must be at least 0" in capsys.readouterr().err


def test_calibrate_empty_pool(tiny_folder, tmp_path, capsys):
    data = write_pool(tmp_path / "pool.jsonl")
    args = calibrate_args(tiny_folder, data, tmp_path / "cal.json")
    args[args.index("--offset") + 1] = "6"
    assert cli.main(args) == 2
    assert "empty calibration pool: jsonl has 6 examples and --offset 6" in capsys.readouterr().err
    assert not (tmp_path / "cal.json").exists()


def test_calibrate_unwritable_out_fails_before_any_work(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    # Neither the model nor the data exist: the output check must come first.
    args = [
        "calibrate",
        "--model",
        str(tmp_path / "no-model"),
        "--dataset",
        "jsonl",
        "--data",
        str(tmp_path / "no.jsonl"),
        "--n",
        "4",
        "--out",
        str(tmp_path / "file.txt" / "cal.json"),
    ]
    assert cli.main(args) == 2
    assert "cannot write the calibrated config" in capsys.readouterr().err


def test_methods_all_parses_to_every_registered_method():
    from fides_rag.rules import available_methods

    args = cli.build_parser().parse_args(["eval", "--out", "x", "--methods", "all"])
    assert list(args.methods) == available_methods() and args.methods.from_all
    named = cli.build_parser().parse_args(["eval", "--out", "x", "--methods", "cad,all"])
    assert list(named.methods)[0] == "cad" and len(named.methods) == len(available_methods())


def test_eval_named_method_that_cannot_run_is_an_error_before_loading(tmp_path, capsys):
    data = write_pool(tmp_path / "pool.jsonl")
    code = cli.main(
        [
            "eval",
            "--model",
            str(tmp_path / "no-such-model"),
            "--dataset",
            "jsonl",
            "--data",
            str(data),
            "--methods",
            "standard,dvd",
            "--out",
            str(tmp_path / "run"),
            "--no-progress",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "method 'dvd' cannot run on this dataset" in err and "at least 2 documents" in err
    assert not (tmp_path / "run").exists()


def test_fides_config_variant_adds_a_lane_to_an_existing_run(tiny_folder, tmp_path):
    from fides_rag import FidesConfig

    data = write_pool(tmp_path / "pool.jsonl")
    variant = tmp_path / "variant.json"
    FidesConfig(noise_scale=20.0, weights=(0.2, 0.5, 0.3)).to_file(variant)
    run = tmp_path / "run"
    base = [
        "eval",
        "--model",
        str(tiny_folder),
        "--dataset",
        "jsonl",
        "--data",
        str(data),
        "--limit",
        "2",
        "--out",
        str(run),
        "--max-new-tokens",
        "2",
        "--bootstrap",
        "5",
        "--no-progress",
    ]
    assert cli.main([*base, "--methods", "standard,fides"]) == 0
    assert cli.main([*base, "--methods", "standard,fides", "--fides-config", f"calibrated={variant}"]) == 0
    info = json.loads((run / "run.json").read_text())
    assert info["methods"] == ["standard", "fides", "fides-calibrated"]
    assert info["fides_variants"]["fides-calibrated"]["noise_scale"] == 20.0
    record = json.loads((run / "predictions.jsonl").read_text().splitlines()[-1])
    assert all(s["alpha"] is not None for s in record["outputs"]["fides-calibrated"]["steps"])
    results = json.loads((run / "results.json").read_text())
    assert any({c["a"], c["b"]} == {"fides", "fides-calibrated"} for c in results["significance"])
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["eval", "--out", "x", "--fides-config", "no-equals-sign"])


# -- bad input is one line naming what to fix, exit code 2, no traceback ------------------------------------


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def run_cli(argv) -> int:
    """The exit code, whether main returns it or argparse exits with it."""
    try:
        return cli.main(argv)
    except SystemExit as exit_:
        return exit_.code


@pytest.fixture
def no_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_generate_errors_are_one_line(tiny_folder, tmp_path, capsys, monkeypatch, no_gpu):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    model = ["--model", str(tiny_folder)]
    cases = [
        (["generate", "Q?", *model, "--config", str(broken)], f"FidesConfig file {broken} is not valid JSON"),
        (["generate", "Q?", *model, "--config", str(tmp_path / "none.json")], "FidesConfig file not found"),
        (["generate", "Q?", *model, "--config", str(tmp_path)], "is a directory; pass a JSON file"),
        (["generate", "Q?", *model, "--max-new-tokens", "0"], "argument --max-new-tokens: must be at least 1, got 0"),
        (["generate", "  ", *model], "argument question: must be a non-empty question"),
        (
            ["generate", "Q?", "--model", "no-such-org/no-such-model"],
            "unknown model: 'no-such-org/no-such-model' is not a bundled alias",
        ),
        (["generate", "Q?", "--model", str(tmp_path / "missing")], f"no model folder at {tmp_path / 'missing'}"),
        (["generate", "Q?", "--model", str(tmp_path / "missing.gguf")], "no .gguf file at"),
        (["generate", "Q?", *model, "--device", "cuda"], "device 'cuda' is not available"),
    ]
    for argv, message in cases:
        assert run_cli(argv) == 2, argv
        err = one_line(capsys)
        assert err.startswith("fides-rag generate: error: ") and message in err, (argv, err)
        assert "huggingface.co" not in err


def test_analyze_of_a_missing_folder_is_one_line(tmp_path, capsys):
    assert run_cli(["analyze", str(tmp_path / "nope")]) == 2
    assert f"no run folder at {tmp_path / 'nope'}; pass the --out folder" in one_line(capsys)
