from __future__ import annotations

import json

import pytest

from fides_rag import cli
from fides_rag.testing import build_tiny_model


@pytest.fixture
def tiny_folder(tmp_path, tokenizer):
    model = build_tiny_model("llama", len(tokenizer))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_methods_lists_builtins(capsys):
    assert cli.main(["methods"]) == 0
    assert capsys.readouterr().out.split()[:4] == ["standard", "cad", "adacad", "fides"]


def test_generate_prints_each_method_and_steps(tiny_folder, capsys):
    code = cli.main(["generate", "Which city?", "--doc", "Lyon is the capital.", "--model", str(tiny_folder),
                     "--methods", "standard,fides", "--max-new-tokens", "3", "--steps"])
    out = capsys.readouterr().out
    assert code == 0
    assert "standard:" in out and "fides:" in out and "alpha" in out


def test_generate_json_lines(tiny_folder, capsys):
    cli.main(["generate", "Which city?", "--doc", "Lyon.", "--model", str(tiny_folder), "--methods", "cad", "--max-new-tokens", "2", "--json"])
    record = json.loads(capsys.readouterr().out.strip())
    assert record["method"] == "cad" and len(record["steps"]) == len(record["token_ids"])


def test_unknown_method_is_rejected(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "Q?", "--methods", "standard,nope"])
    assert "unknown method(s) ['nope']" in capsys.readouterr().err
