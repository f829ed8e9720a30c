"""The one predictions store of `fides-rag eval` and `fides-rag demo`: append, resume, decode only what is missing.

A run folder holds `predictions.jsonl` (one line per example, every method's answer, scores and per-token
records, appended and flushed after every batch) and `run.json` (what was run). Reopening a folder whose
run.json differs on the resume keys is refused with the fix named; otherwise the (example, method) pairs
already in the file are kept and only the missing ones are decoded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fides_rag.eval.datasets import QAExample
from fides_rag.eval.records import example_record, read_predictions

PREDICTIONS = "predictions.jsonl"
RUN_INFO = "run.json"


def check_resume(info_path: Path, info: Mapping[str, Any], keys: Sequence[str], *, what: str = "a run", fix: str = "") -> None:
    """Refuse to resume a run folder whose recorded `info_path` differs from `info` on any of `keys`
    (answers decoded under other settings would not be this run's); the error names each change and the fix."""
    if not info_path.is_file():
        return
    old = json.loads(info_path.read_text(encoding="utf-8"))
    changed = [k for k in keys if old.get(k) != info.get(k)]
    if changed:
        raise ValueError(
            f"{info_path.parent} holds {what} with different {', '.join(changed)} "
            f"({'; '.join(f'{k}: {old.get(k)!r} -> {info.get(k)!r}' for k in changed)}); use a new --out folder{fix}"
        )


class PredictionStore:
    """A run folder's predictions: resumes, decodes only missing (example, method) pairs, appends each batch."""

    def __init__(self, out_dir: str | Path, info: Mapping[str, Any], resume_keys: Sequence[str], *, what: str = "a run") -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / PREDICTIONS
        check_resume(self.out / RUN_INFO, info, resume_keys, what=what, fix=f", or delete {self.path} to start over")
        (self.out / RUN_INFO).write_text(json.dumps(dict(info), indent=2) + "\n", encoding="utf-8")
        self.records: dict[str, dict[str, Any]] = {r["id"]: r for r in read_predictions(self.path, repair=True)}

    def kept_outputs(self, example: QAExample) -> dict[str, Any]:
        """The stored outputs of `example`; none when its record was decoded from other documents."""
        record = self.records.get(example.id)
        if record is None or record.get("documents") != example.meta.get("documents"):
            return {}
        return record["outputs"]

    def missing(self, examples: Sequence[QAExample], labels: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """example id -> the method labels it still lacks (only examples that lack some)."""
        todo = {e.id: tuple(l for l in labels if l not in self.kept_outputs(e)) for e in examples}
        return {i: m for i, m in todo.items() if m}

    def decode(
        self,
        decoder: Any,
        examples: Sequence[QAExample],
        methods: Mapping[str, Any],
        *,
        batch_size: int,
        max_new_tokens: int,
        prompt_length: Callable[[QAExample], int],
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Decode every missing (example, method) pair, one shared prefill per batch, grouped by the methods missing and
        sorted by `prompt_length` to limit padding; merge with the kept outputs and append. Returns the examples decoded."""
        missing = self.missing(examples, list(methods))
        todo = [e for e in examples if e.id in missing]
        todo.sort(key=lambda e: (missing[e.id] != tuple(methods), prompt_length(e)))
        with self.path.open("a", encoding="utf-8") as handle:
            for labels in dict.fromkeys(missing[e.id] for e in todo):
                group = [e for e in todo if missing[e.id] == labels]
                for start in range(0, len(group), batch_size):
                    batch = group[start : start + batch_size]
                    outputs = decoder.generate_batch([e.question for e in batch], [list(e.contexts) for e in batch], methods={label: methods[label] for label in labels}, max_new_tokens=max_new_tokens)
                    for i, example in enumerate(batch):
                        record = example_record(example, {label: outputs[label][i] for label in labels})
                        record["outputs"] = {**self.kept_outputs(example), **record["outputs"]}
                        self.records[example.id] = record
                        handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                    handle.flush()
                    if on_batch is not None:
                        on_batch(len(batch))
        return len(todo)

    def records_for(self, examples: Sequence[QAExample]) -> list[dict[str, Any]]:
        """The stored records of `examples` (those present), in their order."""
        return [self.records[e.id] for e in examples if e.id in self.records]
