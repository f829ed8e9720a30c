"""The one predictions store of `fides-rag eval` and `fides-rag demo`: append, resume, decode only what is missing.

A run folder holds `predictions.jsonl` (one line per example, every method's answer, scores and per-token
records, appended and flushed after every batch) and `run.json` (what was run: among others the data files'
content hash and each method label's options). Reopening a folder whose predictions were made from other settings
(run.json differs on the resume keys, or a method label was decoded with other options) is refused with the fix
named; otherwise the (example, method) pairs already in the file are kept and only the missing ones are decoded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fides_rag.eval.datasets import QAExample
from fides_rag.eval.records import example_record, read_predictions

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder

PREDICTIONS = "predictions.jsonl"
RUN_INFO = "run.json"
METHOD_OPTIONS = "method_options"
"""run.json key: method label -> {"method": rule name, "options": its options}, for every label with answers in the
folder."""


def files_sha256(paths: Sequence[str | Path]) -> str:
    """One SHA-256 over the contents of `paths`, in order (what a run's answers were decoded from)."""
    digest = hashlib.sha256()
    for path in paths:
        with Path(path).open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def make_run_folder(path: str | Path) -> Path:
    """Create the run folder `path` (a new or a previous run's), or raise a ValueError that names the fix."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"--out {path} is a file, not a folder; pass a folder (a new one, or a previous run's to resume)"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(
            f"cannot create the run folder {path} ({err.strerror or err}); pass an --out folder in a place you can "
            "write"
        ) from None
    return path


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _changes(old: Any, new: Any) -> str:
    """ "old -> new", or for two mappings only their differing entries ("fixed_alpha 0.0 -> 5.0")."""
    if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
        return f"{_short(old)} -> {_short(new)}"
    keys = [k for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]
    return ", ".join(f"{k} {_changes(old.get(k), new.get(k))}" for k in keys)


def _option_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    if old.get("method") != new.get("method"):
        return f"method {old.get('method')!r} -> {new.get('method')!r}"
    return _changes(old.get("options") or {}, new.get("options") or {})


def check_resume(
    info_path: Path, info: Mapping[str, Any], keys: Sequence[str], *, what: str = "a run", fix: str = ""
) -> None:
    """Refuse to resume a run folder whose recorded `info_path` differs from `info` on any of `keys`, or records a
    method label of `info[METHOD_OPTIONS]` with other options (answers decoded under other settings would not be this
    run's); the error names each change and the fix."""
    if not info_path.is_file():
        return
    old = json.loads(info_path.read_text(encoding="utf-8"))
    unknown = [k for k in (*keys, METHOD_OPTIONS) if info.get(k) is not None and k not in old]
    if unknown:
        raise ValueError(
            f"{info_path.parent} holds {what} whose run.json does not record {', '.join(unknown)} (written by an older "
            f"fides-rag), so its answers cannot be checked against this run; use a new --out folder{fix}"
        )
    changed = [k for k in keys if old.get(k) != info.get(k)]
    if changed:
        raise ValueError(
            f"{info_path.parent} holds {what} with different {', '.join(changed)} "
            f"({'; '.join(f'{k}: {_changes(old.get(k), info.get(k))}' for k in changed)}); use a new --out folder{fix}"
        )
    before, now = old.get(METHOD_OPTIONS) or {}, info.get(METHOD_OPTIONS) or {}
    relabelled = [label for label in now if label in before and before[label] != now[label]]
    if relabelled:
        changes = "; ".join(f"{label}: {_option_changes(before[label], now[label])}" for label in relabelled)
        raise ValueError(
            f"{info_path.parent} holds answers of {', '.join(relabelled)} decoded with other options ({changes}); "
            f"use a new --out folder or another method label{fix}"
        )


def check_reuse(
    out_dir: str | Path, info: Mapping[str, Any], resume_keys: Sequence[str], *, what: str = "a run"
) -> bool:
    """`check_resume` for a run folder that holds answers to reuse (whether it does); an empty one starts over."""
    path = Path(out_dir) / PREDICTIONS
    if not (path.is_file() and path.stat().st_size):
        return False
    check_resume(Path(out_dir) / RUN_INFO, info, resume_keys, what=what, fix=f", or delete {path} to start over")
    return True


class PredictionStore:
    """A run folder's predictions: resumes, decodes only missing (example, method) pairs, appends each batch."""

    def __init__(
        self, out_dir: str | Path, info: Mapping[str, Any], resume_keys: Sequence[str], *, what: str = "a run"
    ) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / PREDICTIONS
        info = dict(info)
        if (
            check_reuse(self.out, info, resume_keys, what=what)
            and METHOD_OPTIONS in info
            and (self.out / RUN_INFO).is_file()
        ):
            kept = json.loads((self.out / RUN_INFO).read_text(encoding="utf-8")).get(METHOD_OPTIONS) or {}
            info[METHOD_OPTIONS] = {**kept, **info[METHOD_OPTIONS]}  # the labels kept from earlier runs stay recorded
        (self.out / RUN_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        self.records: dict[str, dict[str, Any]] = {r["id"]: r for r in read_predictions(self.path, repair=True)}

    def kept_outputs(self, example: QAExample) -> dict[str, Any]:
        """The stored outputs of `example`; none when its record was decoded from other documents."""
        record = self.records.get(example.id)
        if record is None or record.get("documents") != example.meta.get("documents"):
            return {}
        return record["outputs"]

    def missing(self, examples: Sequence[QAExample], labels: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """example id -> the method labels it still lacks (only examples that lack some)."""
        todo = {e.id: tuple(label for label in labels if label not in self.kept_outputs(e)) for e in examples}
        return {i: m for i, m in todo.items() if m}

    def decode(
        self,
        decoder: FidesDecoder | None,
        examples: Sequence[QAExample],
        methods: Mapping[str, Any],
        *,
        batch_size: int,
        max_new_tokens: int,
        prompt_length: Callable[[QAExample], int],
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Decode every missing (example, method) pair, one shared prefill per batch, grouped by the methods missing and
        sorted by `prompt_length` to limit padding; merge with the kept outputs and append. Returns the examples
        decoded.
        `decoder` may be None only when nothing is missing."""
        missing = self.missing(examples, list(methods))
        todo = [e for e in examples if e.id in missing]
        if todo and decoder is None:
            raise ValueError(f"decoder is None but {len(todo)} examples lack outputs; pass a FidesDecoder")
        todo.sort(key=lambda e: (missing[e.id] != tuple(methods), prompt_length(e)))
        with self.path.open("a", encoding="utf-8") as handle:
            for labels in dict.fromkeys(missing[e.id] for e in todo):
                group = [e for e in todo if missing[e.id] == labels]
                for start in range(0, len(group), batch_size):
                    batch = group[start : start + batch_size]
                    assert decoder is not None  # refused above
                    outputs = decoder.generate_batch(
                        [e.question for e in batch],
                        [list(e.contexts) for e in batch],
                        methods={label: methods[label] for label in labels},
                        max_new_tokens=max_new_tokens,
                    )
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
