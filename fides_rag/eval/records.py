"""One line of predictions.jsonl: an example's trimmed results and scores per method; reading the file back."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fides_rag.eval.datasets import QAExample
from fides_rag.eval.metrics import score_prediction
from fides_rag.result import GenerationResult


def _round(value: float | None, digits: int = 5) -> float | None:
    if value is None or not math.isfinite(value):
        return value
    return round(float(value), digits)


def trim_result(result: GenerationResult) -> dict[str, Any]:
    """A GenerationResult without its prompts, with compact per-token records (None fields dropped)."""
    steps = []
    for s in result.steps:  # every recorded per-token value, read generically from the step's flat dict
        step: dict[str, Any] = {"token": s.token, "token_id": s.token_id}
        for name, value in s.to_dict().items():
            if name not in step and isinstance(value, (int, float)) and not isinstance(value, bool):
                step[name] = _round(value)
        steps.append(step)
    alphas = [step["alpha"] for step in steps if step.get("alpha") is not None]
    return {
        "text": result.text,
        "method": result.method,
        "requested_method": result.requested_method,
        "finish_reason": result.finish_reason,
        "prompt_tokens": result.prompt_tokens,
        "new_tokens": len(result.token_ids),
        "notes": list(result.notes),
        "documents_trimmed": result.documents_trimmed,
        "mean_alpha": _round(sum(alphas) / len(alphas)) if alphas else None,
        "steps": steps,
    }


def example_record(example: QAExample, outputs: Mapping[str, GenerationResult]) -> dict[str, Any]:
    """One predictions.jsonl line: the example's answers and, per method label, its trimmed result and scores."""
    methods = {}
    for label, result in outputs.items():
        entry = trim_result(result)
        entry["scores"] = score_prediction(result.text, example.context_answers, example.memory_answers)
        methods[label] = entry
    return {
        "id": example.id,
        "question": example.question,
        "context_answers": list(example.context_answers),
        "memory_answers": list(example.memory_answers),
        **({"documents": list(example.meta["documents"])} if "documents" in example.meta else {}),
        "conflict": example.is_conflict,
        "form": example.meta.get("form", "conflict" if example.is_conflict else "original"),
        "outputs": methods,
    }


# -- the predictions file ------------------------------------------------------------------------


def read_predictions(path: str | Path, repair: bool = False) -> list[dict[str, Any]]:
    """Every complete record of a predictions file (a later record of the same id replaces an earlier one).

    A line that is not valid JSON can only be a half-written last line of an interrupted run: it is
    skipped, and with repair=True cut from the file so that appends start on a fresh line.
    A bad line anywhere else is an error naming the line.
    """
    path = Path(path)
    if not path.is_file():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records: dict[str, dict[str, Any]] = {}
    keep = 0  # bytes up to and including the newline of the last good line
    offset = 0
    for number, line in enumerate(lines, start=1):
        offset_next = offset + len(line) + 1
        if line.strip():
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or "id" not in record:
                    raise ValueError("not a prediction record")
            except ValueError as err:
                if any(rest.strip() for rest in lines[number:]):
                    raise ValueError(f"{path}, line {number}: not a valid prediction record ({err})") from None
                break  # half-written last line
            records[str(record["id"])] = record
            keep = offset_next
        offset = offset_next
    if repair:
        if keep > len(raw):  # the last good line lacks its newline
            with path.open("ab") as handle:
                handle.write(b"\n")
        elif raw[keep:].strip():
            with path.open("r+b") as handle:
                handle.truncate(keep)
    return list(records.values())
