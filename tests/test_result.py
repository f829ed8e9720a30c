"""GenerationResult.to_metadata: what the integrations put in a framework's response metadata."""

from __future__ import annotations

from fides_rag import GenerationResult, StepRecord


def test_metadata_carries_the_records_prompts_and_counts():
    result = GenerationResult(
        text="Lyon",
        token_ids=[5, 6, 2],
        steps=[
            StepRecord(5, "Ly", {"alpha": 0.5}),
            StepRecord(6, "on", {"alpha": 0.25}),
            StepRecord(2, "", {"alpha": 0.1}),
        ],
        method="fides",
        requested_method="fides",
        method_options={},
        finish_reason="eos",
        context_prompt="C",
        no_context_prompt="N",
        prompt_tokens=12,
        notes=["n"],
        documents_trimmed=True,
        document_tokens=(40, 20),
    )
    meta = result.to_metadata()
    assert meta == {
        "method": "fides",
        "finish_reason": "eos",
        "alphas": [0.5, 0.25, 0.1],
        "steps": [
            {"token_id": 5, "token": "Ly", "alpha": 0.5},
            {"token_id": 6, "token": "on", "alpha": 0.25},
            {"token_id": 2, "token": "", "alpha": 0.1},
        ],
        "notes": ["n"],
        "documents_trimmed": True,
        "document_tokens": (40, 20),
        "context_prompt": "C",
        "no_context_prompt": "N",
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "closed_early": False,
    }
    meta["notes"].append("x")
    assert result.notes == ["n"]  # a copy
