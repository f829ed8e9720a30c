"""FIDES's record as response headers, for clients that expose headers but drop unknown body fields (LangChain's
`ChatOpenAI(include_response_headers=True)` puts them in `response_metadata["headers"]`). A streamed response's
headers leave before decoding, so they carry what the plan knows; the last chunk carries the whole record."""

from __future__ import annotations

import json
from typing import Any

from fides_rag.calls import ChatPlan


def _ascii(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return " ".join(text.encode("ascii", "backslashreplace").decode("ascii").split())


def plan_headers(plan: ChatPlan, requested: str) -> dict[str, str]:
    """What is known before decoding: the method that will decode, the one asked for, the fallback, the documents."""
    return {
        "x-fides-method": _ascii(plan.method or requested),
        "x-fides-requested-method": _ascii(requested),
        "x-fides-fallback": _ascii(plan.fallback or "none"),
        "x-fides-documents-source": _ascii(plan.source),
        "x-fides-num-documents": str(len(plan.documents)),
    }


def record_headers(record: dict[str, Any]) -> dict[str, str]:
    """The record's summary: method, fallback, documents, the mean alpha (where the method records one), notes, and
    whether the grammar closed a structured answer early to fit the budget (complete, so its finish_reason is
    "stop")."""
    alphas = [a for a in record.get("alphas", []) if a is not None]
    headers = {
        "x-fides-method": _ascii(record["method"]),
        "x-fides-requested-method": _ascii(record["requested_method"]),
        "x-fides-fallback": _ascii(record.get("fallback") or "none"),
        "x-fides-documents-source": _ascii(record["documents_source"]),
        "x-fides-num-documents": str(record["num_documents"]),
        "x-fides-notes": _ascii(record.get("notes", [])),
        "x-fides-closed-early": "true" if record.get("closed_early") else "false",
    }
    if alphas:
        headers["x-fides-mean-alpha"] = f"{sum(alphas) / len(alphas):.6f}"
    return headers
