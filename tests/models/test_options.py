"""--device, --dtype, --device-map and --offload-folder: parsing, and a model split by accelerate (layers offloaded
to disk behind hooks) decoding through the CLI exactly like the same model on one device."""

from __future__ import annotations

import argparse
import json

import pytest

import fides_rag.cli.main as cli
from fides_rag import load_model
from fides_rag.models.options import load_options, parse_device_map
from fides_rag.testing import build_tiny_model

# Layers 1 and 2 of the 4-layer tiny llama live on disk and are loaded by accelerate's hooks when used.
SPLIT_MAP = {
    "model.embed_tokens": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "disk",
    "model.layers.3": "cpu",
    "model.norm": "cpu",
    "model.rotary_emb": "cpu",
    "lm_head": "cpu",
}


@pytest.fixture
def tiny_folder(tmp_path, tokenizer):
    model = build_tiny_model("llama", len(tokenizer))
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def test_device_map_accepts_strategies_inline_json_and_files(tmp_path):
    assert parse_device_map("auto") == "auto" and parse_device_map("balanced_low_0") == "balanced_low_0"
    assert parse_device_map('{"model": 0, "lm_head": "cpu"}') == {"model": 0, "lm_head": "cpu"}
    path = tmp_path / "map.json"
    path.write_text(json.dumps(SPLIT_MAP))
    assert parse_device_map(str(path)) == SPLIT_MAP


@pytest.mark.parametrize("value", ["automatic", "{}", "[1, 2]", '{"model": [0]}'])
def test_device_map_rejects_what_accelerate_cannot_read(value):
    with pytest.raises(argparse.ArgumentTypeError, match="expected one of auto, balanced"):
        parse_device_map(value)


def test_device_map_file_that_does_not_exist_is_named(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError, match="cannot read the device map file .*nope.json"):
        parse_device_map(str(tmp_path / "nope.json"))


def test_offload_folder_needs_a_device_map():
    args = argparse.Namespace(device="cpu", dtype="auto", device_map=None, offload_folder="offload")
    with pytest.raises(ValueError, match="--offload-folder only applies with --device-map"):
        load_options(args)
    args.device_map, args.dtype = "auto", "bfloat16"
    assert load_options(args) == {
        "device": "cpu",
        "dtype": "bfloat16",
        "device_map": "auto",
        "offload_folder": "offload",
    }


def test_bad_dtype_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "Q?", "--dtype", "float8"])
    assert "invalid choice: 'float8'" in capsys.readouterr().err


def test_generate_with_offload_folder_but_no_device_map_is_one_line(tiny_folder, capsys):
    assert cli.main(["generate", "Q?", "--model", str(tiny_folder), "--offload-folder", "x"]) == 2
    assert "--offload-folder only applies with --device-map" in capsys.readouterr().err


def _generate_json(tiny_folder, capsys, *extra):
    assert (
        cli.main(
            [
                "generate",
                "Which city?",
                "--doc",
                "Lyon is the capital.",
                "--model",
                str(tiny_folder),
                "--methods",
                "standard,cad,fides",
                "--max-new-tokens",
                "6",
                "--json",
                *extra,
            ]
        )
        == 0
    )
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_the_split_map_is_dispatched_by_accelerate(tiny_folder, tmp_path):
    args = cli.build_parser().parse_args(
        ["generate", "Q?", "--device-map", json.dumps(SPLIT_MAP), "--offload-folder", str(tmp_path)]
    )
    model, _ = load_model(str(tiny_folder), **load_options(args))
    assert model.hf_device_map == SPLIT_MAP
    assert next(model.model.layers[1].parameters()).device.type == "meta"  # on disk until its hook loads it
    assert next(model.model.layers[0].parameters()).device.type == "cpu"


def test_generate_on_a_model_split_to_disk_equals_one_device(tiny_folder, tmp_path, capsys):
    alone = _generate_json(tiny_folder, capsys, "--device", "cpu")
    split = _generate_json(
        tiny_folder, capsys, "--device-map", json.dumps(SPLIT_MAP), "--offload-folder", str(tmp_path / "offload")
    )
    assert [r["token_ids"] for r in split] == [r["token_ids"] for r in alone]
    for a, b in zip(alone, split):
        assert [s.get("alpha", 0.0) for s in a["steps"]] == pytest.approx(
            [s.get("alpha", 0.0) for s in b["steps"]], abs=1e-5
        )


def test_eval_on_a_model_split_to_disk_equals_one_device(tiny_folder, tmp_path):
    rows = [
        {
            "id": f"ex{i}",
            "question": f"What is the capital of country {i}?",
            "contexts": [f"City {i} is the capital."],
            "context_answers": [f"City {i}"],
            "memory_answers": ["Paris"],
        }
        for i in range(4)
    ]
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    base = [
        "eval",
        "--model",
        str(tiny_folder),
        "--dataset",
        "jsonl",
        "--data",
        str(data),
        "--methods",
        "standard,fides",
        "--max-new-tokens",
        "4",
        "--bootstrap",
        "5",
        "--no-progress",
    ]
    assert cli.main([*base, "--device", "cpu", "--out", str(tmp_path / "one")]) == 0
    assert (
        cli.main(
            [
                *base,
                "--device-map",
                json.dumps(SPLIT_MAP),
                "--offload-folder",
                str(tmp_path / "offload"),
                "--out",
                str(tmp_path / "split"),
            ]
        )
        == 0
    )

    def answers(run):
        lines = (tmp_path / run / "predictions.jsonl").read_text().splitlines()
        return {
            r["id"]: {m: [s["token_id"] for s in o["steps"]] for m, o in r["outputs"].items()}
            for r in map(json.loads, lines)
        }

    assert answers("split") == answers("one")


def test_serve_warmup_needs_compile_and_is_a_one_line_error(capsys):
    assert cli.main(["serve", "--warmup", "--model", "unused"]) == 2
    assert "--warmup needs --compile" in capsys.readouterr().err


def test_serve_takes_compile_warmup_and_buckets():
    args = cli.build_parser().parse_args(["serve", "--compile", "--warmup", "--buckets", "1,4,16"])
    assert args.compile and args.warmup and args.buckets == [1, 4, 16]
