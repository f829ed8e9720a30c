"""benchmarks/structured_conflict.py's scoring logic (no model): JSON validity, tool-call validity, the summary."""

from __future__ import annotations

import sys
from pathlib import Path

from fides_rag.calls import ToolCalling
from fides_rag.testing import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import structured_conflict as study
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


def test_an_answer_counts_as_valid_only_when_it_loads_and_fits_the_schema():
    assert study.parse_answer('{"answer": "Lyon"}') == (True, "Lyon")
    assert study.parse_answer('{"answer": "Lyon", "extra": 1}') == (False, '{"answer": "Lyon", "extra": 1}')
    assert study.parse_answer('{"answer": "Lyon is the cap') == (
        False,
        '{"answer": "Lyon is the cap',
    )  # cut by the budget
    assert study.parse_answer('{"answer": 3}')[0] is False


def test_a_tool_call_is_valid_only_with_the_tools_name_and_schema_valid_arguments():
    calling = ToolCalling(build_tokenizer(chat=True), [study.RETRIEVE], tool_choice=study.RETRIEVE.name)
    valid, call = study.call_is_valid(calling, '{"query": "capital of France"}')  # a forced call: its arguments
    assert valid and call.name == "retrieve_passages" and call.arguments == {"query": "capital of France"}
    assert study.call_is_valid(calling, "{}")[0] is False
    assert study.call_is_valid(calling, '{"query": "x"')[0] is False


def test_the_summary_gives_rates_and_gains_over_standard():
    def out(context, valid=True):
        return {
            "valid_json": valid,
            "text": '{"answer": "x"}' if valid else '{"answer": "x',
            "context": context,
            "memory": 1.0 - context,
        }

    records = [
        {
            "tool_call_valid": True,
            "documents_source": "tool_messages",
            "forms": {f: {"standard": out(0.0), "fides": out(1.0, f != "agent")} for f in study.FORMS},
        },
        {
            "tool_call_valid": False,
            "documents_source": "tool_messages",
            "forms": {f: {"standard": out(0.0), "fides": out(0.0)} for f in study.FORMS},
        },
    ]
    summary = study.summarize(records, ["standard", "fides"])
    assert summary["rows"] == 2 and summary["tool_call_valid"] == 50.0
    assert summary["metrics"]["plain"]["fides"]["valid_json"] is None
    assert summary["metrics"]["agent"]["fides"] == {
        "valid_json": 50.0,
        "unfinished": 50.0,
        "context": 50.0,
        "memory": 50.0,
    }
    assert summary["context_gain_over_standard"]["structured"] == {"fides": 50.0}
    tests = {(c["what"], c["form"]): c for c in summary["comparisons"]}
    assert tests[("fides − standard", "structured")]["diff"] == 50.0
    assert tests[("fides gain − plain gain", "structured")]["diff"] == 0.0  # the plain template gained as much
