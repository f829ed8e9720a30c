"""The one predictions store: what is missing, what is kept, and refusing another run's folder."""

from __future__ import annotations

import json

import pytest

from fides_rag.eval.datasets import QAExample
from fides_rag.eval.store import METHOD_OPTIONS, PREDICTIONS, PredictionStore, files_sha256, make_run_folder
from fides_rag.result import GenerationResult, StepRecord


class _EchoDecoder:
    """Answers with the first word of the first passage; records every call."""

    def __init__(self):
        self.calls = []

    def generate_batch(self, questions, documents, *, methods, max_new_tokens):
        self.calls.append((len(questions), tuple(methods)))
        return {m: [_result(docs[0].split()[0], m) for docs in documents] for m in methods}


def _result(text, method):
    return GenerationResult(
        text=text,
        token_ids=[7],
        steps=[StepRecord(token_id=7, token=text, values={"alpha": 0.25})],
        method=method,
        requested_method=method,
        method_options={},
        finish_reason="stop",
        context_prompt="",
        no_context_prompt=None,
    )


def _examples(docs=("Lyon is the capital.", "Paris is big.")):
    return [
        QAExample("Capital?", (d,), ("Lyon",), ("Paris",), f"q{i}", {"documents": [f"d{i}"]})
        for i, d in enumerate(docs)
    ]


def _decode(store, decoder, examples, methods):
    return store.decode(
        decoder, examples, {m: m for m in methods}, batch_size=1, max_new_tokens=4, prompt_length=lambda e: 0
    )


def test_decodes_only_missing_pairs_and_keeps_the_rest(tmp_path):
    examples = _examples()
    first = PredictionStore(tmp_path, {"model": "m"}, ("model",))
    assert _decode(first, _EchoDecoder(), examples, ["standard"]) == 2
    again = PredictionStore(tmp_path, {"model": "m"}, ("model",))
    assert again.missing(examples, ["standard", "cad"]) == {"q0": ("cad",), "q1": ("cad",)}
    decoder = _EchoDecoder()
    _decode(again, decoder, examples, ["standard", "cad"])
    assert decoder.calls == [(1, ("cad",)), (1, ("cad",))]
    records = again.records_for(examples)
    assert [set(r["outputs"]) for r in records] == [{"standard", "cad"}] * 2
    assert records[0]["outputs"]["cad"]["steps"][0]["alpha"] == 0.25 and records[0]["documents"] == ["d0"]
    assert len((tmp_path / PREDICTIONS).read_text().splitlines()) == 4  # appended, the later line wins on reading


def test_a_record_from_other_documents_is_decoded_again(tmp_path):
    store = PredictionStore(tmp_path, {"model": "m"}, ("model",))
    _decode(store, _EchoDecoder(), _examples(), ["standard"])
    moved = [
        QAExample(e.question, e.contexts, e.context_answers, e.memory_answers, e.id, {"documents": ["other"]})
        for e in _examples()
    ]
    assert PredictionStore(tmp_path, {"model": "m"}, ("model",)).missing(moved, ["standard"]) == {
        "q0": ("standard",),
        "q1": ("standard",),
    }


def test_refuses_a_folder_of_another_model_and_names_the_fix(tmp_path):
    _decode(PredictionStore(tmp_path, {"model": "a"}, ("model",)), _EchoDecoder(), _examples(), ["standard"])
    with pytest.raises(
        ValueError,
        match=r"different model \(model: 'a' -> 'b'\); use a new --out folder, or delete .*predictions.jsonl",
    ):
        PredictionStore(tmp_path, {"model": "b"}, ("model",))
    assert json.loads((tmp_path / "run.json").read_text()) == {"model": "a"}
    (tmp_path / PREDICTIONS).unlink()  # the fix the error names: nothing is kept, so the folder starts over
    assert PredictionStore(tmp_path, {"model": "b"}, ("model",)).missing(_examples(), ["standard"]) == {
        "q0": ("standard",),
        "q1": ("standard",),
    }
    assert json.loads((tmp_path / "run.json").read_text()) == {"model": "b"}


def _options(alpha):
    return {"cad": {"method": "cad", "options": {"alpha": alpha}}, "standard": {"method": "standard", "options": {}}}


def test_refuses_a_method_label_decoded_with_other_options(tmp_path):
    info = lambda options: {"model": "m", METHOD_OPTIONS: options}  # noqa: E731
    _decode(
        PredictionStore(tmp_path, info(_options(1.0)), ("model",)), _EchoDecoder(), _examples(), ["standard", "cad"]
    )
    with pytest.raises(
        ValueError,
        match=r"holds answers of cad decoded with other options \(cad: alpha 1\.0 -> 5\.0\); use a new --out "
        r"folder or another method label, or delete .*predictions.jsonl",
    ):
        PredictionStore(tmp_path, info(_options(5.0)), ("model",))
    # a run of other labels keeps the old labels' options recorded, so a later run cannot slip a change past them
    PredictionStore(tmp_path, info({"standard": _options(1.0)["standard"]}), ("model",))
    assert json.loads((tmp_path / "run.json").read_text())[METHOD_OPTIONS] == _options(1.0)
    with pytest.raises(ValueError, match="cad: alpha 1.0 -> 5.0"):
        PredictionStore(tmp_path, info({"cad": _options(5.0)["cad"]}), ("model",))
    assert PredictionStore(tmp_path, info({**_options(1.0), "cad-2": _options(2.0)["cad"]}), ("model",)).missing(
        _examples(), ["cad-2"]
    )


def test_refuses_a_folder_that_did_not_record_what_this_run_checks(tmp_path):
    _decode(PredictionStore(tmp_path, {"model": "m"}, ("model",)), _EchoDecoder(), _examples(), ["standard"])
    with pytest.raises(
        ValueError, match=r"does not record data_sha256, method_options .*; use a new --out folder, or delete"
    ):
        PredictionStore(
            tmp_path, {"model": "m", "data_sha256": "ab", METHOD_OPTIONS: _options(1.0)}, ("model", "data_sha256")
        )


def test_files_sha256_follows_the_content_not_the_path(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("one\n")
    b.write_text("one\n")
    assert files_sha256([a]) == files_sha256([b]) != files_sha256([a, b])
    b.write_text("two\n")
    assert files_sha256([a]) != files_sha256([b])


def test_make_run_folder_names_the_fix(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"--out .*file is a file, not a folder; pass a folder"):
        make_run_folder(tmp_path / "file")
    with pytest.raises(
        ValueError, match=r"cannot create the run folder .*; pass an --out folder in a place you can write"
    ):
        make_run_folder(tmp_path / "file" / "run")
    assert make_run_folder(tmp_path / "a" / "b").is_dir()
