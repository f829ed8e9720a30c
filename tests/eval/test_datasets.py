import gzip
import json

import pandas as pd
import pytest

from fides_rag.eval.datasets import (
    DatasetError,
    load_examples,
    load_nq_open,
    load_nq_swap,
    load_popqa,
    load_qa_jsonl,
)

SWAP_ROWS = [
    {
        "question": "who sings it",
        "org_context": "<P> Sung by Tim . </P>",
        "org_answer": ["Tim"],
        "sub_context": "<P> Sung by <b>Yuliya</b> . </P>",
        "sub_answer": ["Yuliya"],
    },
    {
        "question": "capital of france",
        "org_context": "<Li> Paris </Li>",
        "org_answer": ["Paris"],
        "sub_context": "<Td> Lyon </Td>",
        "sub_answer": ["Lyon", "Lyons"],
    },
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_nq_swap_forms(tmp_path, suffix):
    path = tmp_path / f"swap.{suffix}"
    if suffix == "parquet":
        pd.DataFrame(SWAP_ROWS).to_parquet(path)
    else:
        _jsonl(path, SWAP_ROWS)
    conflict = load_nq_swap(path)
    assert [e.id for e in conflict] == ["nq-swap-0", "nq-swap-1"]
    assert conflict[0].contexts == ("Sung by Yuliya .",)  # tags stripped
    assert conflict[1].context_answers == ("Lyon", "Lyons") and conflict[1].memory_answers == ("Paris",)
    assert conflict[0].is_conflict
    original = load_nq_swap(path, "original")
    assert original[0].contexts == ("Sung by Tim .",) and original[0].context_answers == ("Tim",)
    assert not original[0].is_conflict
    both = load_nq_swap(path, "both", limit=1)
    assert [e.id for e in both] == ["nq-swap-0-c", "nq-swap-0-o"]
    assert conflict[1].original_answers == original[1].original_answers == ("Paris",)  # org_answer on both forms


def test_nq_swap_bad_field_names_line(tmp_path):
    rows = [SWAP_ROWS[0], {**SWAP_ROWS[1], "sub_answer": 5}]
    with pytest.raises(DatasetError, match=r"swap\.jsonl, line 2, field 'sub_answer'"):
        load_nq_swap(_jsonl(tmp_path / "swap.jsonl", rows))
    rows = [SWAP_ROWS[0], {k: v for k, v in SWAP_ROWS[1].items() if k != "question"}]
    with pytest.raises(DatasetError, match=r"line 2, field 'question': missing"):
        load_nq_swap(_jsonl(tmp_path / "swap.jsonl", rows))
    pd.DataFrame([{k: v for k, v in r.items() if k != "sub_context"} for r in SWAP_ROWS]).to_parquet(
        tmp_path / "bad.parquet"
    )
    with pytest.raises(DatasetError, match=r"bad\.parquet, field 'sub_context'"):
        load_nq_swap(tmp_path / "bad.parquet")


def test_nq_swap_missing_file_and_hub_without_datasets(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        load_nq_swap(tmp_path / "nope.parquet")
    import builtins

    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError("no datasets")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(RuntimeError, match="needs the `datasets` package"):
        load_nq_swap("pminervini/NQ-Swap")


def test_nq_open_gold_passages(tmp_path):
    path = tmp_path / "oracle.jsonl.gz"
    rows = [
        {
            "question": "q1",
            "answers": ["A1"],
            "ctxs": [
                {"title": "T", "text": "gold text", "isgold": True, "hasanswer": True},
                {"title": "U", "text": "other", "isgold": False},
            ],
        },
        {"question": "q2", "answers": ["A2"], "ctxs": [{"title": "", "text": "no gold", "isgold": False}]},
    ]
    with gzip.open(path, "wt") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in rows))
    first = load_nq_open(path, limit=1)
    assert first[0].contexts == ("T: gold text",) and first[0].context_answers == ("A1",) and not first[0].is_conflict
    with pytest.raises(DatasetError, match=r"line 2, field 'ctxs\[\]\.isgold'"):
        load_nq_open(path)


def test_popqa_passages_by_line(tmp_path):
    path = _jsonl(
        tmp_path / "popqa_longtail.jsonl",
        [
            {"question": "What is X's occupation?", "answers": ["politician", "pol"], "id": 7},
            {"question": "Where was Y born?", "answers": ["Oslo"], "id": 8},
        ],
    )
    (tmp_path / "popqa_longtail_passages.txt").write_text("#X was a politician.\n#Y lived in Rome.\n")
    examples = load_popqa(path)
    assert [e.id for e in examples] == ["popqa-7", "popqa-8"]
    assert examples[0].contexts == ("X was a politician.",)
    assert examples[0].meta["has_answer"] and not examples[1].meta["has_answer"]
    (tmp_path / "popqa_longtail_passages.txt").write_text("#only one\n")
    with pytest.raises(DatasetError, match="passages.txt, line 2"):
        load_popqa(path)


def test_user_jsonl(tmp_path):
    path = _jsonl(
        tmp_path / "mine.jsonl",
        [
            {"question": "q", "contexts": "one passage", "context_answers": ["a"], "memory_answers": ["b"], "id": "x1"},
            {"question": "q2", "contexts": ["p1", "p2"], "context_answers": "c"},
        ],
    )
    examples = load_qa_jsonl(path)
    assert examples[0].is_conflict and examples[0].id == "x1"
    assert examples[1].contexts == ("p1", "p2") and examples[1].id == "mine-1" and not examples[1].is_conflict
    assert load_examples("jsonl", path, limit=1) == examples[:1]
    assert examples[0].original_answers == ("b",) and examples[1].original_answers == ()


def test_user_jsonl_original_answers_mark_what_an_agreeing_row_could_be_known_as(tmp_path):
    path = _jsonl(
        tmp_path / "mine.jsonl",
        [
            {"question": "q", "contexts": "p", "context_answers": ["Paris"], "original_answers": ["Paris"]},
            {
                "question": "q",
                "contexts": "p",
                "context_answers": ["Lyon"],
                "memory_answers": ["Paris"],
                "original_answers": "Paris",
            },
        ],
    )
    agreeing, swapped = load_qa_jsonl(path)
    assert agreeing.original_answers == ("Paris",) and not agreeing.is_conflict
    assert swapped.original_answers == ("Paris",) and swapped.is_conflict


@pytest.mark.parametrize(
    "line, pattern",
    [
        ('{"question": "q", "contexts": ["p"]}', r"bad\.jsonl, line 2, field 'context_answers': missing"),
        ('{"question": "", "contexts": ["p"], "context_answers": ["a"]}', r"line 2, field 'question'"),
        ('{"question": "q", "contexts": [1], "context_answers": ["a"]}', r"line 2, field 'contexts'"),
        ('{"question": "q", "contexts": ["p"], "context_answers": []}', r"line 2, field 'context_answers': empty"),
        ('{"question": "q", "contexts": ["p"], "context_answers": ["a"], "id": "x"}', r"line 2, field 'id': repeats"),
        ('{"question": "q", ', r"bad\.jsonl, line 2: not valid JSON"),
        ("[1, 2]", r"line 2: expected a JSON object"),
    ],
)
def test_user_jsonl_errors_name_file_line_field(tmp_path, line, pattern):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "contexts": ["p"], "context_answers": ["a"], "id": "x"}\n' + line + "\n")
    with pytest.raises(DatasetError, match=pattern):
        load_qa_jsonl(path)


def test_shared_data_loads_when_present():
    from fides_rag.eval.datasets import data_dir

    if not (data_dir() / "nq_swap").is_dir():
        pytest.skip("shared data not available")
    assert len(load_examples("nq-swap", limit=3)) == 3
    assert len(load_examples("nq-open", limit=3)) == 3
    popqa = load_examples("popqa", limit=3)
    assert len(popqa) == 3 and all(e.contexts[0] for e in popqa)
    both = load_examples("nq-swap-both", limit=4)
    assert [e.is_conflict for e in both] == [True, False, True, False]


def test_a_missing_relative_path_and_a_corrupt_parquet_name_the_file(tmp_path):
    from fides_rag.eval.datasets import DatasetError, load_nq_swap

    with pytest.raises(FileNotFoundError, match=r"no file at data/nope"):
        load_nq_swap("data/nope")
    corrupt = tmp_path / "nq.parquet"
    corrupt.write_bytes(b"PAR1" + b"\x00garbage" * 40 + b"PAR1")
    with pytest.raises(DatasetError, match=r"nq\.parquet.*cannot be read as parquet"):
        load_nq_swap(corrupt)


def test_dataset_files_are_the_files_a_loader_reads(tmp_path, monkeypatch):
    from fides_rag.eval.datasets import dataset_files

    monkeypatch.setenv("FIDES_RAG_DATA", str(tmp_path))
    (tmp_path / "popqa").mkdir()
    for name in ("popqa_longtail.jsonl", "popqa_longtail_passages.txt"):
        (tmp_path / "popqa" / name).write_text("")
    assert dataset_files("popqa") == [
        tmp_path / "popqa" / "popqa_longtail.jsonl",
        tmp_path / "popqa" / "popqa_longtail_passages.txt",
    ]
    assert dataset_files("popqa", passages=tmp_path / "p.txt")[1] == tmp_path / "p.txt"
    mine = tmp_path / "mine.jsonl"
    mine.write_text("")
    assert dataset_files("jsonl", mine) == [mine] == dataset_files("nq-swap-both", mine)
    assert dataset_files("nq-swap", "pminervini/NQ-Swap") == []  # a hub dataset id: no local file


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_an_answer_column_of_lists_written_as_text_is_read_as_lists(tmp_path, suffix):
    import numpy as np

    rows = [
        {**SWAP_ROWS[0], "sub_answer": str(["Yuliya"]), "org_answer": str(np.array(["Emma", "Emma Stone"]))},
        {**SWAP_ROWS[1], "sub_answer": "Lyon", "org_answer": "['Paris', \"Paris's centre\"]"},
    ]  # a bare string is one answer
    path = tmp_path / f"swap.{suffix}"
    if suffix == "parquet":
        pd.DataFrame(rows).to_parquet(path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, second = load_nq_swap(path)
    assert first.context_answers == ("Yuliya",) and first.memory_answers == ("Emma", "Emma Stone")
    assert second.context_answers == ("Lyon",) and second.memory_answers == ("Paris", "Paris's centre")
    pd.DataFrame([{**SWAP_ROWS[0], "sub_answer": "['Yuliya', 3]"}]).to_parquet(path.with_suffix(".bad.parquet"))
    with pytest.raises(
        DatasetError, match=r"field 'sub_answer': a list written as text that cannot be read as a list of strings"
    ):
        load_nq_swap(path.with_suffix(".bad.parquet"))


SWAP_NAMES = ["nq-swap", "bigbench-conflicts"]


@pytest.mark.parametrize("name", SWAP_NAMES)
def test_every_dataset_in_nq_swaps_schema_loads_under_three_names(tmp_path, monkeypatch, name):
    from fides_rag.eval.datasets import DATASETS, DEFAULT_FILES

    monkeypatch.setenv("FIDES_RAG_DATA", str(tmp_path))
    default = tmp_path / DEFAULT_FILES[name]
    default.parent.mkdir(parents=True)
    pd.DataFrame(SWAP_ROWS).to_parquet(default)
    assert {name, f"{name}-original", f"{name}-both"} <= set(DATASETS)
    conflict = load_examples(name)
    assert [e.id for e in conflict] == [f"{name}-0", f"{name}-1"] and all(e.is_conflict for e in conflict)
    assert conflict[0].contexts == ("Sung by Yuliya .",) and conflict[1].memory_answers == ("Paris",)
    original = load_examples(f"{name}-original")
    assert original[1].context_answers == ("Paris",) and not original[1].is_conflict
    assert [e.id for e in load_examples(f"{name}-both", limit=3)] == [f"{name}-0-c", f"{name}-0-o", f"{name}-1-c"]
    assert conflict[1].original_answers == original[1].original_answers == ("Paris",)


def test_bigbench_conflicts_loads_like_nq_swap_from_the_same_rows(tmp_path):
    from fides_rag.eval.datasets import load_bigbench_conflicts

    path = _jsonl(tmp_path / "rows.jsonl", SWAP_ROWS)
    for form in ("conflict", "original", "both"):
        nq, bigbench = load_nq_swap(path, form), load_bigbench_conflicts(path, form)
        assert [e.id.replace("nq-swap", "bigbench-conflicts") for e in nq] == [e.id for e in bigbench]
        assert [(e.contexts, e.context_answers, e.memory_answers) for e in nq] == [
            (e.contexts, e.context_answers, e.memory_answers) for e in bigbench
        ]


@pytest.mark.parametrize("name", ["nq-swap-both", "bigbench-conflicts", "bigbench-conflicts-original"])
def test_a_file_missing_a_field_names_the_file_the_field_and_the_dataset(tmp_path, name):
    rows = [SWAP_ROWS[0], {k: v for k, v in SWAP_ROWS[1].items() if k != "org_answer"}]
    pattern = rf"rows\.jsonl, line 2, field 'org_answer': missing: dataset '{name}' expects the fields"
    with pytest.raises(DatasetError, match=pattern):
        load_examples(name, _jsonl(tmp_path / "rows.jsonl", rows))
    pd.DataFrame([{k: v for k, v in r.items() if k != "sub_answer"} for r in SWAP_ROWS]).to_parquet(
        tmp_path / "rows.parquet"
    )
    with pytest.raises(DatasetError, match=rf"rows\.parquet, field 'sub_answer': missing: dataset '{name}'"):
        load_examples(name, tmp_path / "rows.parquet")


def test_a_missing_bigbench_file_names_the_dataset_and_the_data_folder(tmp_path, monkeypatch):
    from fides_rag.eval.datasets import dataset_files

    monkeypatch.setenv("FIDES_RAG_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"BIG-bench conflicts file not found at .*FIDES_RAG_DATA"):
        load_examples("bigbench-conflicts-both")
    with pytest.raises(FileNotFoundError, match="BIG-bench conflicts file not found at owner/name"):
        load_examples("bigbench-conflicts", "owner/name")  # no hub id: a path that is not there
    assert dataset_files("bigbench-conflicts-both") == []
    (tmp_path / "bigbench_conflicts").mkdir()
    (tmp_path / "bigbench_conflicts" / "bigbench_conflicts_public.parquet").write_bytes(b"")
    assert dataset_files("bigbench-conflicts-original") == [
        tmp_path / "bigbench_conflicts" / "bigbench_conflicts_public.parquet"
    ]


def test_shared_bigbench_conflicts_loads_when_present():
    from fides_rag.eval.datasets import data_dir

    if not (data_dir() / "bigbench_conflicts").is_dir():
        pytest.skip("shared data not available")
    both = load_examples("bigbench-conflicts-both", limit=4)
    assert [e.id for e in both] == [f"bigbench-conflicts-{i}-{f}" for i in (0, 1) for f in "co"]
    assert all(e.contexts[0] and "<" not in e.contexts[0] for e in both)
