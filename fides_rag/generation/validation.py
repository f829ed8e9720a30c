"""Refusals made before any decoding, so bad input wastes no work: per-document paths need >= 2 documents
and cannot come from raw prompts."""

from __future__ import annotations

from collections.abc import Sequence

from fides_rag.generation.prompting import PreparedExample
from fides_rag.rules.base import DOCUMENTS, ContrastRule


def refuse_document_paths(rule: ContrastRule) -> None:
    """Raw prompts carry no separable documents: refuse a rule with per-document paths."""
    if DOCUMENTS in rule.paths:
        raise ValueError(
            f"method {rule.name!r} runs one path per document, which raw prompts cannot provide; pass the "
            f"question and its documents to generate / generate_batch / stream instead"
        )


def check_document_paths(examples: Sequence[PreparedExample], rules: Sequence[ContrastRule], first: int = 0) -> None:
    """Every example a rule with per-document paths decodes has >= 2 prepared document prompts
    (examples without documents, which go to 'standard', are not checked). Errors number the examples from `first`."""
    for rule in rules:
        if DOCUMENTS not in rule.paths:
            continue
        for i, example in enumerate(examples, first):
            if not example.has_documents:
                continue  # decoded with 'standard' on the question alone, like under every method
            if example.document_ids is None:
                raise ValueError(
                    f"method {rule.name!r} runs one path per document, but example {i} has no per-document "
                    f"prompts: raw prompts cannot provide them, and `prepare` makes them only with "
                    f"document_paths=True; pass the question and its documents to generate / generate_batch / stream"
                )
            if len(example.document_ids) < 2:
                raise ValueError(
                    f"method {rule.name!r} contrasts a question's documents with each other and needs at least "
                    f"2 documents per question, but example {i} has {len(example.document_ids)}; give it more "
                    f"documents or use a method without per-document paths (e.g. 'cad')"
                )
