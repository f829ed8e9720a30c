"""Faithfulness under a JSON-schema constraint on NQ-Swap conflict rows, in three forms, for each method.

- plain: fides-rag's own question + documents template, unconstrained (the reference);
- structured: the same request with `json_schema={"answer": str}` (the document in the prompt);
- agent: the question as the user turn; the model calls a retrieval tool (forced by `ToolCalling(tool_choice=<name>)`
  and its `constraint()`); the row's passage comes back as the tool message, and the model answers under the same
  `{"answer": str}` schema. FIDES's context path is the tool message (`ChatPrompts.from_tool_turns`, source
  "tool_messages"); the no-context path is the same conversation with the tool message emptied.

Each batch of rows decodes every method over one shared prefill (`generate_batch(methods=...)`), greedy. Scores use
the eval harness's SQuAD normalisation: "context contained" / "memory contained" = the substituted / original answer
occurs in the answer (`contains_answer`); for constrained forms the answer is the JSON's "answer" field when the
output is valid JSON of the schema (`json.loads` + `jsonschema`), else the raw text.

    python benchmarks/structured_conflict.py --model smollm2-135m-instruct --rows 100 --out results/structured-conflict

Writes <out>/<model>.json (settings, every row's outputs, the summary; rewritten after every batch, and a rerun with
the same settings resumes from it) and <out>/<model>.md (the table).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema

from fides_rag import FidesDecoder
from fides_rag.calls import ChatPrompts, ToolCall, ToolCalling, ToolSpec
from fides_rag.eval.datasets import QAExample, load_examples
from fides_rag.eval.metrics import contains_answer
from fides_rag.eval.significance import paired_bootstrap
from fides_rag.eval.tables import markdown_table

METHODS = ("standard", "cad", "adacad", "fides")
FORMS = ("plain", "structured", "agent")
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
RETRIEVE = ToolSpec(
    "retrieve_passages",
    "Search the knowledge base and return the passage that answers a question.",
    {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "what to search for"}},
        "required": ["query"],
    },
)


def parse_answer(text: str) -> tuple[bool, str]:
    """(valid JSON of ANSWER_SCHEMA, the answer to score: the "answer" field if valid, else the raw text)."""
    try:
        value = json.loads(text)
        jsonschema.validate(value, ANSWER_SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False, text
    return True, value["answer"]


def call_is_valid(calling: ToolCalling, text: str) -> tuple[bool, ToolCall | None]:
    """(exactly one call of RETRIEVE whose arguments validate against its parameters, that call)."""
    _, calls = calling.parse(text)
    if len(calls) != 1 or calls[0].name != RETRIEVE.name:
        return False, None
    try:
        jsonschema.validate(calls[0].arguments, RETRIEVE.parameters)
    except jsonschema.ValidationError:
        return False, calls[0]
    return True, calls[0]


def score(example: QAExample, answer: str) -> dict[str, float]:
    return {
        "context": contains_answer(answer, example.context_answers),
        "memory": contains_answer(answer, example.memory_answers),
    }


def decode_plain(
    decoder: FidesDecoder, rows: Sequence[QAExample], methods: Sequence[str], max_new: int, schema: Any
) -> dict[str, list[str]]:
    """label -> texts of the template request (question + documents), with `schema` as json_schema when given."""
    options = {"json_schema": schema} if schema is not None else {}
    out = decoder.generate_batch(
        [e.question for e in rows],
        [list(e.contexts) for e in rows],
        methods=list(methods),
        max_new_tokens=max_new,
        **options,
    )
    return {label: [r.text for r in results] for label, results in out.items()}


def decode_agent(
    decoder: FidesDecoder, rows: Sequence[QAExample], methods: Sequence[str], max_new: int
) -> list[dict[str, Any]]:
    """The agent form of each row: the forced tool call (no documents yet: one 'standard' decode), then the answer
    after the tool message under every method."""
    forced = ToolCalling(decoder.tokenizer, [RETRIEVE], tool_choice=RETRIEVE.name)
    chat = ChatPrompts(
        decoder.tokenizer,
        context_window=decoder.limits.context_window,
        use_chat_template=decoder.prompts.use_chat_template,
    )
    first = [
        chat.with_tools(forced).plain([("user", e.question)], "no tool has answered yet", e.question, fallback=False)
        for e in rows
    ]
    calls = decoder.generate_batch(
        [p.prompt()[0] for p in first], method="standard", max_new_tokens=max_new, json_schema=forced.constraint()
    )
    answering = chat.with_tools(ToolCalling(decoder.tokenizer, [RETRIEVE], tool_choice="auto"))
    records, pairs = [], []
    for example, result in zip(rows, calls):
        valid, call = call_is_valid(forced, result.text)
        call = call or ToolCall(
            RETRIEVE.name, {"query": example.question}
        )  # an invalid call still gets the passage back
        turns = [
            ("user", example.question),
            ("assistant", forced.render_calls("", [call])),
            ("tool", example.contexts[0]),
        ]
        plan = answering.from_tool_turns(turns, max_new, question=example.question)
        pairs.append(plan.prompt()[0])
        records.append({"tool_call": result.text, "tool_call_valid": valid, "documents_source": plan.source})
    out = decoder.generate_batch(pairs, methods=list(methods), max_new_tokens=max_new, json_schema=ANSWER_SCHEMA)
    for i, record in enumerate(records):
        record["texts"] = {label: out[label][i].text for label in out}
    return records


def run_rows(
    decoder: FidesDecoder, rows: Sequence[QAExample], methods: Sequence[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    plain = decode_plain(decoder, rows, methods, args.max_new_tokens, None)
    structured = decode_plain(decoder, rows, methods, args.max_new_tokens_json, ANSWER_SCHEMA)
    agent = decode_agent(decoder, rows, methods, args.max_new_tokens_json)
    records = []
    for i, example in enumerate(rows):
        forms: dict[str, Any] = {"plain": {}, "structured": {}, "agent": {}}
        for label in methods:
            forms["plain"][label] = {"text": plain[label][i], **score(example, plain[label][i])}
            for form, text in (("structured", structured[label][i]), ("agent", agent[i]["texts"][label])):
                valid, answer = parse_answer(text)
                forms[form][label] = {"text": text, "valid_json": valid, "answer": answer, **score(example, answer)}
        records.append(
            {
                "id": example.id,
                "question": example.question,
                "context_answers": list(example.context_answers),
                "memory_answers": list(example.memory_answers),
                "tool_call": agent[i]["tool_call"],
                "tool_call_valid": agent[i]["tool_call_valid"],
                "documents_source": agent[i]["documents_source"],
                "forms": forms,
            }
        )
    return records


def unfinished(output: dict[str, Any]) -> bool:
    """An invalid constrained output that stopped before its closing brace (the token budget ran out)."""
    return not output["valid_json"] and not output["text"].rstrip().endswith("}")


def summarize(records: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    """Per form and method: valid JSON %, context / memory contained %; the tool-call validity; FIDES's gains."""
    n = len(records)
    pct = lambda values: round(100.0 * sum(values) / n, 1) if n else None  # noqa: E731
    table: dict[str, Any] = {}
    for form in FORMS:
        table[form] = {}
        for label in methods:
            outs = [r["forms"][form][label] for r in records]
            constrained = form != "plain"
            table[form][label] = {
                "valid_json": pct([o["valid_json"] for o in outs]) if constrained else None,
                "unfinished": pct([unfinished(o) for o in outs]) if constrained else None,
                "context": pct([o["context"] for o in outs]),
                "memory": pct([o["memory"] for o in outs]),
            }
    gains = (
        {
            form: {
                label: round(table[form][label]["context"] - table[form]["standard"]["context"], 1)
                for label in methods
                if label != "standard"
            }
            for form in FORMS
        }
        if "standard" in methods and n
        else {}
    )
    return {
        "rows": n,
        "tool_call_valid": pct([r["tool_call_valid"] for r in records]),
        "documents_source": sorted({r["documents_source"] for r in records}),
        "metrics": table,
        "context_gain_over_standard": gains,
        "comparisons": comparisons(records, methods) if "standard" in methods and n else [],
    }


def comparisons(records: Sequence[dict[str, Any]], methods: Sequence[str], samples: int = 1000) -> list[dict[str, Any]]:
    """Paired bootstrap on context contained (points): each method − standard in each form, and each constrained
    form's gain over standard − the plain template's gain on the same rows."""

    def gain(form: str, label: str) -> list[float]:
        return [100 * (r["forms"][form][label]["context"] - r["forms"][form]["standard"]["context"]) for r in records]

    out = []
    for label in [m for m in methods if m != "standard"]:
        for form in FORMS:
            test = paired_bootstrap(gain(form, label), [0.0] * len(records), samples=samples, seed=0)
            out.append({"what": f"{label} − standard", "form": form, **_rounded(test)})
        for form in FORMS[1:]:
            test = paired_bootstrap(gain(form, label), gain("plain", label), samples=samples, seed=0)
            out.append({"what": f"{label} gain − plain gain", "form": form, **_rounded(test)})
    return out


def _rounded(test: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in test.items()}


def markdown(model: str, summary: dict[str, Any], methods: Sequence[str], command: str) -> str:
    head = [
        "form",
        "method",
        "valid JSON %",
        "unfinished %",
        "context contained %",
        "memory contained %",
        "context gain over standard",
    ]
    rows = []
    for form in FORMS:
        for label in methods:
            m = summary["metrics"][form][label]
            gain = summary["context_gain_over_standard"].get(form, {}).get(label)
            rows.append(
                [
                    form,
                    label,
                    *("–" if m[k] is None else f"{m[k]:.1f}" for k in ("valid_json", "unfinished")),
                    f"{m['context']:.1f}",
                    f"{m['memory']:.1f}",
                    "–" if gain is None else f"{gain:+.1f}",
                ]
            )
    tests = [
        [c["what"], c["form"], f"{c['diff']:+.1f}", f"[{c['ci_low']:+.1f}, {c['ci_high']:+.1f}]", f"{c['p_value']:.3f}"]
        for c in summary.get("comparisons", [])
        if c["diff"] is not None
    ]
    return (
        f"Model `{model}`, {summary['rows']} NQ-Swap conflict rows, greedy. Agent form: schema-valid forced tool calls "
        f"{summary['tool_call_valid']:.1f}% (documents source {', '.join(summary['documents_source'])}). "
        "Unfinished: invalid output cut "
        f"by the token budget before its closing brace.\n\n"
        f"{markdown_table(head, rows)}\n\nContext contained, paired bootstrap (1000 resamples, two-sided 95% CI; p "
        "from a "
        "paired permutation test), in "
        f"points:\n\n{markdown_table(['comparison', 'form', 'diff', '95% CI', 'p'], tests)}\n\n"
        f"Command: `{command}`\n"
    )


def load_done(path: Path, settings: dict[str, Any]) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    saved = json.loads(path.read_text())
    if saved["settings"] != settings:
        raise SystemExit(
            f"{path} was written with other settings ({saved['settings']}); pass another --out or delete it"
        )
    return saved["records"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", required=True, help="alias (smollm2-135m-instruct, gemma3-270m) or a local model folder"
    )
    parser.add_argument("--rows", type=int, default=100, help="the first N conflict rows of NQ-Swap")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32, help="plain form (the eval harness's default)")
    parser.add_argument("--max-new-tokens-json", type=int, default=48, help="structured answers and tool calls")
    parser.add_argument("--data", default=None, help="NQ-Swap file (default: the shared data folder)")
    parser.add_argument("--out", default="results/structured-conflict")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    rows = load_examples("nq-swap", args.data, limit=args.rows)
    name = Path(args.model).name
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    settings = {
        "model": args.model,
        "methods": methods,
        "max_new_tokens": args.max_new_tokens,
        "max_new_tokens_json": args.max_new_tokens_json,
        "answer_schema": ANSWER_SCHEMA,
        "tool": RETRIEVE.openai(),
    }
    records = load_done(path, settings)[: args.rows]
    done = {r["id"] for r in records}
    todo = [e for e in rows if e.id not in done]
    command = (
        f"python benchmarks/structured_conflict.py --model {args.model} --rows {args.rows} --methods "
        f"{','.join(methods)} "
        f"--batch-size {args.batch_size} --out {args.out}"
    )
    from tqdm.auto import tqdm

    decoder = FidesDecoder.from_pretrained(args.model) if todo else None
    started = time.perf_counter()
    bar = tqdm(total=len(rows), initial=len(rows) - len(todo), unit="row")
    for start in range(0, len(todo), args.batch_size):
        batch = todo[start : start + args.batch_size]
        records += run_rows(decoder, batch, methods, args)
        order = {e.id: i for i, e in enumerate(rows)}
        records.sort(key=lambda r: order[r["id"]])
        summary = summarize(records, methods)
        path.write_text(
            json.dumps({"settings": settings, "command": command, "summary": summary, "records": records}, indent=1)
            + "\n"
        )
        bar.update(len(batch))
    bar.close()
    summary = summarize(records, methods)
    path.write_text(
        json.dumps(
            {
                "settings": settings,
                "command": command,
                "summary": summary,
                "records": records,
                "seconds_last_run": round(time.perf_counter() - started, 1),
            },
            indent=1,
        )
        + "\n"
    )
    text = markdown(name, summary, methods, command)
    (out / f"{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
