"""Benchmark data as one common example type: question, context passages, context answers, memory answers.

Loaders (all return `list[QAExample]`):

- `load_nq_swap(path_or_hub_id, form)`: NQ-Swap (pminervini/NQ-Swap schema), parquet/jsonl or the hub id.
  form="conflict": substituted passage + answer, memory answer = original answer;
  form="original": original passage + answer (the non-conflict control); form="both": each row in both forms.
- `load_bigbench_conflicts(path, form)`: BIG-bench's contextual_parametric_knowledge_conflicts in NQ-Swap's schema
  (about one row per question), parquet/jsonl, with the same forms. Both are `load_swap_dataset`, registered in
  `SWAP_DATASETS`; `load_examples` takes each as NAME, NAME-original and NAME-both.
- `load_nq_open(path)`: NQ-open oracle (gold passage(s) = the `ctxs` with `isgold`), non-conflict.
- `load_popqa(path, passages)`: PopQA long-tail; line i of the passages file belongs to question i.
- `load_qa_jsonl(path)`: any jsonl with the common fields, so users can bring their own data:
  `question` (str), `contexts` (list[str] or str), `context_answers` (list[str] or str),
  `memory_answers` (optional list[str]), `original_answers` (optional list[str]), `id` (optional).

`QAExample.original_answers` is the question's own answer before any swap, what a model can know closed-book
(`fides-rag eval --strata` needs it on every row): `org_answer` on both forms of NQ-Swap's schema; in a user jsonl the
`memory_answers` of a conflict row, or `original_answers` given on a row whose passage agrees with it.

Bad files raise `DatasetError`, whose message names the file, the line (1-based) and the field (and, for a field
missing from a dataset in NQ-Swap's schema, the dataset name that expects it).
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from fides_rag.extras import require

DATA_ENV = "FIDES_RAG_DATA"
NQ_SWAP_HUB_ID = "pminervini/NQ-Swap"
DEFAULT_FILES = {
    "nq-swap": "nq_swap/nq_swap_dev_public.parquet",
    "bigbench-conflicts": "bigbench_conflicts/bigbench_conflicts_public.parquet",
    "nq-open": "nq_open/nq-open-oracle.jsonl.gz",
    "popqa": "popqa/popqa_longtail.jsonl",
}
"""Each benchmark's file under data_dir()."""
_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*[^>]*>")


@dataclass(frozen=True)
class QAExample:
    """One question with the passages given as evidence and the answers each source supports."""

    question: str
    contexts: tuple[str, ...]
    context_answers: tuple[str, ...]
    """Answers supported by the passages (what a faithful reader says)."""
    memory_answers: tuple[str, ...] = ()
    """Answers the model may have memorised, when they differ from the passages (conflict form)."""
    id: str = ""
    meta: dict = field(default_factory=dict, compare=False)
    original_answers: tuple[str, ...] = ()
    """The question's own answer before any swap (what a model can know closed-book); empty when the dataset does
    not say (then `fides-rag eval --strata` cannot run on it)."""

    @property
    def is_conflict(self) -> bool:
        """Conflict form: the passages support an answer that differs from the memorised one."""
        return bool(self.memory_answers)


class DatasetError(ValueError):
    """A bad dataset file; the message names the file, the line and the field."""

    def __init__(self, path: str | Path, line: int | None, field_name: str | None, problem: str) -> None:
        where = str(path)
        if line is not None:
            where += f", line {line}"
        if field_name is not None:
            where += f", field '{field_name}'"
        super().__init__(f"{where}: {problem}")
        self.path, self.line, self.field = str(path), line, field_name


def data_dir() -> Path:
    """Benchmark data: $FIDES_RAG_DATA, else ../shared/data beside the repository checkout."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "data"


def strip_html(text: str) -> str:
    """Drop Natural Questions' HTML-like tags (<P>, <Li>, <Td>, ...) and collapse whitespace."""
    return " ".join(_TAG.sub(" ", text).split())


# -- reading helpers ------------------------------------------------------------------------------


def _require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found at {path}; pass a path or set ${DATA_ENV} to the data folder")
    return path


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) for every non-blank line; a bad line raises DatasetError naming it."""
    path = Path(path)
    with _open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetError(path, number, None, f"not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(record, dict):
                raise DatasetError(path, number, None, f"expected a JSON object, got {type(record).__name__}")
            yield number, record


def _text(record: dict[str, Any], name: str, path: Path | str, line: int) -> str:
    if name not in record or record[name] is None:
        raise DatasetError(path, line, name, "missing")
    value = record[name]
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(path, line, name, f"expected a non-empty string, got {value!r:.80}")
    return value


def _listed(text: str) -> list[str] | None:
    """The strings of a list written as text, as a CSV round trip or astype(str) leaves a list column: Python's
    "['Lyon', 'Lyons']" or numpy's "['Lyon' 'Lyons']"; None when `text` is not bracketed (a single answer).
    Raises ValueError for a bracketed text that is no list of strings."""
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:  # numpy's repr has no commas, and Python would join adjacent literals: add them
        value = ast.literal_eval(re.sub(r"(['\"])\s+(['\"])", r"\1, \2", text))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ValueError(
        "a list written as text that cannot be read as a list of strings; store the answers as a list of strings"
    )


def _strings(
    record: dict[str, Any], name: str, path: Path | str, line: int, *, required: bool = True
) -> tuple[str, ...]:
    """A list of non-empty strings (a numpy array, a single string, or a list written as text are accepted too)."""
    if name not in record or record[name] is None:
        if required:
            raise DatasetError(path, line, name, "missing")
        return ()
    value = record[name]
    if isinstance(value, str):
        try:
            value = _listed(value) or [value]
        except ValueError as err:
            raise DatasetError(path, line, name, f"{err} (got {value!r:.80})") from None
    elif hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise DatasetError(path, line, name, f"expected a list of strings, got {value!r:.80}")
    value = tuple(v for v in value if v.strip())
    if required and not value:
        raise DatasetError(path, line, name, "empty (needs at least one non-empty string)")
    return value


def _take(records: Iterator[tuple[int, dict[str, Any]]], limit: int | None) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, item in enumerate(records):
        if limit is not None and i >= limit:
            return
        yield item


# -- NQ-Swap's schema: NQ-Swap and BIG-bench conflicts --------------------------------------------


@dataclass(frozen=True)
class SwapDataset:
    """A dataset in NQ-Swap's schema, loaded under three names: NAME (swapped passages), NAME-original and NAME-both."""

    name: str
    """The dataset name and the prefix of its example ids."""
    title: str
    """How messages name it."""
    hub_id: str | None = None
    """A hub dataset id it may be loaded from (split `dev`), or None (local files only)."""


SWAP_DATASETS = {
    d.name: d
    for d in (
        SwapDataset("nq-swap", "NQ-Swap", NQ_SWAP_HUB_ID),
        SwapDataset("bigbench-conflicts", "BIG-bench conflicts"),
    )
}
"""Each dataset in NQ-Swap's schema by name."""
SWAP_FIELDS = ("question", "org_context", "org_answer", "sub_context", "sub_answer")
"""NQ-Swap's schema: every row holds these fields."""
SwapForm = Literal["conflict", "original", "both"]
SWAP_FORMS: dict[str, SwapForm] = {"": "conflict", "-original": "original", "-both": "both"}
"""The suffix of a dataset name -> the form it loads."""


def swap_dataset(name: str) -> tuple[SwapDataset, SwapForm] | None:
    """The dataset in NQ-Swap's schema and the form a dataset name loads (`bigbench-conflicts-both`: BIG-bench
    conflicts, both forms); None for a name of another dataset."""
    for base, dataset in SWAP_DATASETS.items():
        for suffix, form in SWAP_FORMS.items():
            if name == base + suffix:
                return dataset, form
    return None


def _missing_fields(dataset: str, fields: list[str]) -> str:
    return f"missing: dataset '{dataset}' expects the fields {', '.join(SWAP_FIELDS)} (absent: {', '.join(fields)})"


def _read_parquet(path: Path, dataset: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number from 1, record) of a parquet file in NQ-Swap's schema; a missing column names the dataset."""
    pd = require("pandas", purpose="reading parquet files")
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # pyarrow's errors for corrupt pages, bad magic bytes, ...
        raise DatasetError(
            path, None, None, f"cannot be read as parquet ({type(err).__name__}: {err}); re-download or re-export it"
        ) from None
    missing = [f for f in SWAP_FIELDS if f not in frame.columns]
    if missing:
        raise DatasetError(path, None, missing[0], _missing_fields(dataset, missing))
    # Parquet has no lines: rows are numbered from 1 like jsonl lines.
    return ((i + 1, row) for i, row in enumerate(frame.to_dict("records")))


def _read_hub(source: str, path: Path, dataset: SwapDataset) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number from 1, record) of the hub dataset `source` (split `dev`)."""
    try:
        import datasets  # noqa: F401  (optional dependency, imported only for hub ids)
        from datasets import load_dataset
    except ImportError:
        if source == dataset.hub_id:
            raise RuntimeError(
                f"loading {source!r} from the hub needs the `datasets` package (pip install datasets); "
                f"or pass a local parquet/jsonl file with the {dataset.title} schema"
            ) from None
        raise FileNotFoundError(
            f"no file at {source} ({path.resolve()}); as a hub dataset id it needs the `datasets` package "
            "(pip install datasets); pass an existing parquet/jsonl path"
        ) from None
    try:
        data = load_dataset(source, split="dev")
    except Exception as err:  # no network, unknown id, ...
        raise FileNotFoundError(
            f"no file at {source} ({path.resolve()}), and it could not be loaded as a hub dataset id either "
            f"({type(err).__name__}); pass an existing parquet/jsonl path"
        ) from None
    return ((i + 1, row) for i, row in enumerate(data))


def _looks_like_hub_id(source: str | Path, path: Path) -> bool:
    return isinstance(source, str) and "/" in source and not source.startswith((".", "/")) and not path.suffix


def _swap_rows(
    source: str | Path, dataset: SwapDataset, name: str
) -> tuple[Path | str, Iterator[tuple[int, dict[str, Any]]]]:
    """(name for messages, iterator of (line/row number, record)) from a file or, where the dataset has one, a hub id;
    `name` is the dataset name the messages give."""
    path = Path(source)
    if path.is_file():
        return path, (_read_parquet(path, name) if path.suffix == ".parquet" else iter_jsonl(path))
    if dataset.hub_id is not None and (str(source) == dataset.hub_id or _looks_like_hub_id(source, path)):
        return str(source), _read_hub(str(source), path, dataset)
    hub = f", the hub id {dataset.hub_id!r}" if dataset.hub_id else ""
    raise FileNotFoundError(
        f"{dataset.title} file not found at {source}; pass a parquet/jsonl path{hub}, or set ${DATA_ENV}"
    )


def _swap_examples(row: dict[str, Any], where: Path | str, line: int, prefix: str) -> tuple[QAExample, QAExample]:
    """The conflict and the original example of one row in NQ-Swap's schema, both with the id <prefix>-<row>."""
    question = _text(row, "question", where, line)
    org_context, sub_context = _text(row, "org_context", where, line), _text(row, "sub_context", where, line)
    org_answer, sub_answer = _strings(row, "org_answer", where, line), _strings(row, "sub_answer", where, line)
    base = f"{prefix}-{line - 1}"
    conflict = QAExample(
        question, (strip_html(sub_context),), sub_answer, org_answer, base, {"form": "conflict"}, org_answer
    )
    original = QAExample(question, (strip_html(org_context),), org_answer, (), base, {"form": "original"}, org_answer)
    return conflict, original


def load_swap_dataset(
    dataset: str | SwapDataset, path: str | Path | None = None, form: SwapForm = "conflict", limit: int | None = None
) -> list[QAExample]:
    """A dataset in NQ-Swap's schema (see SWAP_DATASETS) from a parquet or jsonl file (default: its file under
    data_dir()), or from its hub id where it has one.

    conflict: the substituted passage and answer, memory answer = the original answer (id <name>-<row>).
    original: the original passage and answer, no memory answer (no conflict; id <name>-<row>).
    both: each row twice, ids <name>-<row>-c (conflict) and <name>-<row>-o (original).
    HTML-like tags are stripped from the passages. `limit` keeps the first rows. A row or a parquet file missing a
    field is a DatasetError naming the file, the field and the dataset name that expects it.
    """
    if form not in SWAP_FORMS.values():
        raise ValueError(f"form must be 'conflict', 'original' or 'both', got {form!r}")
    if not isinstance(dataset, SwapDataset) and dataset not in SWAP_DATASETS:
        raise ValueError(f"unknown dataset {dataset!r} in NQ-Swap's schema; choose from {', '.join(SWAP_DATASETS)}")
    spec = dataset if isinstance(dataset, SwapDataset) else SWAP_DATASETS[dataset]
    name = spec.name + next(suffix for suffix, f in SWAP_FORMS.items() if f == form)
    where, rows = _swap_rows(path if path is not None else data_dir() / DEFAULT_FILES[spec.name], spec, name)
    examples = []
    for line, row in _take(rows, limit):
        missing = [f for f in SWAP_FIELDS if row.get(f) is None]
        if missing:
            raise DatasetError(where, line, missing[0], _missing_fields(name, missing))
        conflict, original = _swap_examples(row, where, line, spec.name)
        if form == "both":
            examples += [replace(conflict, id=conflict.id + "-c"), replace(original, id=original.id + "-o")]
        else:
            examples.append(conflict if form == "conflict" else original)
    return examples


def load_nq_swap(
    path: str | Path | None = None, form: SwapForm = "conflict", limit: int | None = None
) -> list[QAExample]:
    """NQ-Swap (pminervini/NQ-Swap schema) from a parquet or jsonl file, or the hub id `pminervini/NQ-Swap`; ids
    nq-swap-<row> (see load_swap_dataset for the forms)."""
    return load_swap_dataset("nq-swap", path, form, limit)


def load_bigbench_conflicts(
    path: str | Path | None = None, form: SwapForm = "conflict", limit: int | None = None
) -> list[QAExample]:
    """BIG-bench's contextual_parametric_knowledge_conflicts in NQ-Swap's schema, from a parquet or jsonl file; ids
    bigbench-conflicts-<row> (see load_swap_dataset for the forms)."""
    return load_swap_dataset("bigbench-conflicts", path, form, limit)


# -- NQ-open oracle -------------------------------------------------------------------------------


def load_nq_open(path: str | Path | None = None, limit: int | None = None) -> list[QAExample]:
    """NQ-open oracle (non-conflict control): the `ctxs` marked `isgold` are the passages, `answers` the context
    answers.

    Passages are "title: text" when a title is present. No memory answers (no conflict). id nq-open-<line-1>.
    """
    path = _require_file(Path(path) if path is not None else data_dir() / DEFAULT_FILES["nq-open"], "NQ-open oracle")
    examples = []
    for line, record in _take(iter_jsonl(path), limit):
        question = _text(record, "question", path, line)
        answers = _strings(record, "answers", path, line)
        ctxs = record.get("ctxs")
        if not isinstance(ctxs, list) or not ctxs:
            raise DatasetError(path, line, "ctxs", "missing or not a non-empty list of passages")
        gold = []
        for k, ctx in enumerate(ctxs):
            if not isinstance(ctx, dict) or not isinstance(ctx.get("text"), str):
                raise DatasetError(path, line, f"ctxs[{k}].text", "missing or not a string")
            if ctx.get("isgold"):
                title = ctx.get("title") or ""
                gold.append(f"{title}: {ctx['text']}" if title else ctx["text"])
        if not gold:
            raise DatasetError(path, line, "ctxs[].isgold", "no passage is marked as gold")
        examples.append(
            QAExample(
                question, tuple(strip_html(g) for g in gold), answers, (), f"nq-open-{line - 1}", {"form": "original"}
            )
        )
    return examples


# -- PopQA long-tail ------------------------------------------------------------------------------


def _popqa_passages(path: Path, passages: str | Path | None) -> Path:
    return Path(passages) if passages is not None else path.with_name(path.stem + "_passages.txt")


def load_popqa(
    path: str | Path | None = None, passages: str | Path | None = None, limit: int | None = None
) -> list[QAExample]:
    """PopQA long-tail with its retrieved passages: line i of `passages` belongs to question i.

    The context answers are the gold aliases (`answers`); no memory answers. The leading '#' of each
    passage line is dropped. meta holds `pop`, `prop` and `has_answer` (a gold alias occurs in the passage).
    """
    from fides_rag.eval.metrics import normalize_answer

    path = _require_file(Path(path) if path is not None else data_dir() / DEFAULT_FILES["popqa"], "PopQA")
    passages = _popqa_passages(path, passages)
    _require_file(passages, "PopQA passages")
    texts = passages.read_text(encoding="utf-8").splitlines()
    examples = []
    for index, (line, record) in enumerate(_take(iter_jsonl(path), limit)):
        question = _text(record, "question", path, line)
        answers = _strings(record, "answers", path, line)
        if index >= len(texts):
            raise DatasetError(
                passages,
                index + 1,
                None,
                f"the passages file has {len(texts)} lines but {path} has more "
                "questions; line i must belong to question i",
            )
        text = texts[index].lstrip("#").strip()
        if not text:
            raise DatasetError(passages, index + 1, None, "empty passage line")
        norm = normalize_answer(text)
        has_answer = any(normalize_answer(a) and normalize_answer(a) in norm for a in answers)
        ident = record.get("id", index)
        meta = {
            "form": "original",
            "pop": record.get("pop"),
            "prop": record.get("prop"),
            "has_answer": has_answer,
            "question_id": record.get("question_id", index),
        }
        examples.append(QAExample(question, (text,), answers, (), f"popqa-{ident}", meta))
    if limit is None and len(examples) != len(texts):
        raise DatasetError(
            passages,
            None,
            None,
            f"has {len(texts)} lines but {path} has {len(examples)} questions; line i must belong to question i",
        )
    return examples


# -- user jsonl -----------------------------------------------------------------------------------


def load_qa_jsonl(path: str | Path, limit: int | None = None) -> list[QAExample]:
    """Any jsonl with the common fields: question, contexts, context_answers, memory_answers (optional),
    original_answers (optional), id (optional).

    A record with memory answers is a conflict-form sample; its original answers are its memory answers unless
    `original_answers` says otherwise. Missing ids become <file stem>-<line-1>;
    repeated ids are an error (resuming a run relies on them).
    """
    path = _require_file(Path(path), "QA jsonl")
    examples, seen = [], dict[str, int]()
    for line, record in _take(iter_jsonl(path), limit):
        question = _text(record, "question", path, line)
        contexts = _strings(record, "contexts", path, line)
        answers = _strings(record, "context_answers", path, line)
        memory = _strings(record, "memory_answers", path, line, required=False)
        original = _strings(record, "original_answers", path, line, required=False) or memory
        ident = record.get("id")
        ident = f"{path.name.split('.')[0]}-{line - 1}" if ident is None else str(ident)
        if ident in seen:
            raise DatasetError(path, line, "id", f"repeats the id {ident!r} of line {seen[ident]}")
        seen[ident] = line
        meta = {"form": "conflict" if memory else "original"}
        examples.append(QAExample(question, contexts, answers, memory, ident, meta, original))
    return examples


# -- one entry point ------------------------------------------------------------------------------

DATASETS = (*(name + suffix for name in SWAP_DATASETS for suffix in SWAP_FORMS), "nq-open", "popqa", "jsonl")
"""Every dataset name `load_examples` takes."""


def load_examples(
    name: str, path: str | Path | None = None, *, limit: int | None = None, passages: str | Path | None = None
) -> list[QAExample]:
    """Load a dataset by name (see DATASETS); `path` overrides the default file under data_dir()."""
    swap = swap_dataset(name)
    if swap is not None:
        dataset, form = swap
        rows = (limit + 1) // 2 if limit is not None and form == "both" else limit  # "both": two examples a row
        return load_swap_dataset(dataset, path, form, rows)[:limit]
    if name == "nq-open":
        return load_nq_open(path, limit)
    if name == "popqa":
        return load_popqa(path, passages, limit)
    if name == "jsonl":
        if path is None:
            raise ValueError("dataset 'jsonl' needs --data PATH")
        return load_qa_jsonl(path, limit)
    raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")


def dataset_files(name: str, path: str | Path | None = None, *, passages: str | Path | None = None) -> list[Path]:
    """The local files `load_examples(name, path, passages=...)` read; none for a hub dataset id."""
    swap = swap_dataset(name)
    family = swap[0].name if swap is not None else name
    if path is None:
        if family not in DEFAULT_FILES:
            return []
        path = data_dir() / DEFAULT_FILES[family]
    path = Path(path)
    if not path.is_file():
        return []
    return [path, _popqa_passages(path, passages)] if family == "popqa" else [path]
