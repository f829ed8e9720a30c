"""Structured output against a document that contradicts memory, by route: the answer as a JSON schema
(`response_format`) and as a forced call of the schema as a tool (`tools` + a named `tool_choice`: what LangChain's
`with_structured_output(method="function_calling")` and LlamaIndex's `PydanticProgramMode.FUNCTION` send).

Each request is planned and decoded as the server plans and decodes it (`fides_rag.serve.planning.build_call` on a
`ChatCompletionRequest` with `documents`), greedy:

- json_schema: `response_format` = the Place schema (one question with documents: fides-rag's template);
- function: the Place schema as a tool, forced. A call forced to one tool is decoded as its arguments alone under the
  tool's schema, with no tool block in the prompt, and wrapped into the call (`ToolCalling.arguments_only`), so its
  prompt is the json_schema route's; "same answer" counts the rows where the two routes give the same city and
  country (the tool's parameters are closed, as OpenAI's strict function calling closes them; `response_format` here
  is not `strict`, so its answer may add keys).

Scored: "city from the document" (the city the document names) and "country of that city" (the country the document's
city lies in: the model infers it; the document names only the city).

    python benchmarks/forced_call_conflict.py --model gemma3-270m --out results/structured-conflict/forced-call

Writes <out>/<model>.json (every row's outputs and the summary) and <out>/<model>.md (the table).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fides_rag import FidesDecoder
from fides_rag.calls import CallFactory
from fides_rag.eval.tables import markdown_table
from fides_rag.serve.agent_call import agent_call
from fides_rag.serve.planning import build_call, chat_plan
from fides_rag.serve.protocol import ChatCompletionRequest


class Place(BaseModel):
    city: str
    country: str


ROWS = [  # (landmark, the document's city, that city's country)
    ("the Eiffel Tower", "Rome", "Italy"),
    ("the Colosseum", "Paris", "France"),
    ("Big Ben", "Madrid", "Spain"),
    ("the Statue of Liberty", "Sydney", "Australia"),
    ("the Brandenburg Gate", "Tokyo", "Japan"),
    ("the Sydney Opera House", "Toronto", "Canada"),
    ("the Taj Mahal", "Cairo", "Egypt"),
    ("the Kremlin", "Lisbon", "Portugal"),
]
FORMS = ("json_schema", "function")
METHODS = ("standard", "fides")


def body(landmark: str, city: str, form: str, method: str, max_tokens: int) -> dict[str, Any]:
    """The chat request of one route."""
    request: dict[str, Any] = {
        "model": "m",
        "method": method,
        "max_tokens": max_tokens,
        "documents": [f"{landmark[0].upper()}{landmark[1:]} is in {city}."],
        "messages": [{"role": "user", "content": f"Where is {landmark}? Give the city and the country."}],
    }
    if form == "json_schema":
        request["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "Place", "schema": Place.model_json_schema()},
        }
    else:
        request["tools"] = [
            {"type": "function", "function": {"name": "Place", "parameters": Place.model_json_schema()}}
        ]
        request["tool_choice"] = {"type": "function", "function": {"name": "Place"}}
    return request


def answer(calls: CallFactory, landmark: str, city: str, form: str, method: str, max_tokens: int) -> dict[str, Any]:
    request = ChatCompletionRequest.model_validate(body(landmark, city, form, method, max_tokens))
    done = build_call(calls, request, method, chat_plan, agent_call(calls, request)).run()
    place = done.tool_calls[0].arguments if done.tool_calls else _json(done.text)
    return {"text": done.text or json.dumps(place), "place": place, "method": done.record["method"]}


def _fields(out: dict[str, Any]) -> tuple[Any, Any]:
    """The (city, country) an answer gives (the JSON-schema route may add keys: its schema is not closed)."""
    place = out["place"] if isinstance(out["place"], dict) else {}
    return place.get("city"), place.get("country")


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def score(place: Any, city: str, country: str) -> dict[str, bool]:
    place = place if isinstance(place, dict) else {}
    return {
        "city": city.lower() in str(place.get("city", "")).lower(),
        "country": country.lower() in str(place.get("country", "")).lower(),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", required=True, help="alias (gemma3-270m, smollm2-135m-instruct) or a local model folder"
    )
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", default="results/structured-conflict/forced-call")
    args = parser.parse_args(argv)
    calls = CallFactory(FidesDecoder.from_pretrained(args.model))
    records = []
    for landmark, city, country in ROWS:
        row: dict[str, Any] = {"landmark": landmark, "city": city, "country": country, "forms": {}}
        for form in FORMS:
            row["forms"][form] = {}
            for method in METHODS:
                out = answer(calls, landmark, city, form, method, args.max_tokens)
                row["forms"][form][method] = {**out, **score(out["place"], city, country)}
        records.append(row)
    summary: dict[str, Any] = {
        form: {
            method: {k: sum(r["forms"][form][method][k] for r in records) for k in ("city", "country")}
            for method in METHODS
        }
        for form in FORMS
    }
    summary["same_answer"] = {
        method: sum(
            _fields(r["forms"]["function"][method]) == _fields(r["forms"]["json_schema"][method]) for r in records
        )
        for method in METHODS
    }
    name = Path(args.model).name
    flags = f"--model {args.model} --max-tokens {args.max_tokens} --out {args.out}"
    command = f"python benchmarks/forced_call_conflict.py {flags}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(
        json.dumps({"command": command, "rows": len(records), "summary": summary, "records": records}, indent=1) + "\n"
    )
    n = len(records)
    rows = [
        [
            form,
            method,
            f"{summary[form][method]['city']}/{n}",
            f"{summary[form][method]['country']}/{n}",
            f"{summary['same_answer'][method]}/{n}",
        ]
        for form in FORMS
        for method in METHODS
    ]
    header = ["route", "method", "city from the document", "country of that city", "same answer as json_schema"]
    text = (
        f"Model `{name}`, {n} landmarks each placed in another city by its document, greedy.\n\n"
        f"{markdown_table(header, rows)}\n\nCommand: `{command}`\n"
    )
    (out / f"{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
