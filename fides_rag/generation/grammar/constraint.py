"""Grammar-constrained decoding: a JSON schema, a regex or a Lark/GBNF grammar, compiled once per tokenizer by
llguidance, and one state per request that refuses every token that would break the structure.

Contract with the decode loop. The mask applies to the FINAL logits of a step, after the contrast rule's
`combine`, so the contrast decides among valid tokens only. Per step, with the rows' states (None for a row with
no grammar), on the thread that owns the states:

    mask_logits_rows(states, logits)    # one host bitmask [n, ceil(V/32)], one H2D copy, one in-place add
    tokens = choose(logits)             # greedy or sampled, as without a grammar
    for state, token in zip(states, tokens.tolist()):
        state.accept(token)             # the host ints the loop brings back anyway

On a GPU the host half can overlap the forward: `fill_bitmask(states, bitmask)` right after launching it, then
`apply_bitmask(logits, bitmask)` on its output. EOS is admitted only where the structure is complete and is the
only token admitted once nothing can follow; after EOS a state admits EOS only. Logits columns past the tokenizer's
vocabulary (a padded output head) are always refused. `GrammarConstraint.any_text()` refuses nothing: it runs the
same masking path and must leave every logit as it was.
"""

from __future__ import annotations

import json
import os
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fides_rag.errors import BudgetBelowShortestAnswer, GrammarLimitExceeded, GrammarViolation
from fides_rag.extras import require
from fides_rag.generation.grammar.closing import TokenBytes, completes, shortest_completion
from fides_rag.generation.grammar.masks import allocate_bitmask, apply_bitmask, bitmask_width
from fides_rag.generation.grammar.schema_support import check_pattern_limits, check_schema_shape, largest_object

# One-line JSON as json.dumps writes it ({"a": 1, "b": [2, 3]}), no other whitespace: a small model cannot loop on
# blank lines. A schema can override any of these under its "x-guidance" key.
JSON_OPTIONS = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "json_allow_general_unicode_escapes": True,
}
CACHE_SIZE = 256
"""Compiled grammars kept per tokenizer (least recently used dropped first)."""
HORIZON = 32
"""A state looks for its shortest completion once the tokens left are within this many of the last one found."""
RETRY = 8
"""Tokens to wait before looking again after a search found no completion."""
SHORTEST_SEARCH = 1024
"""Tokens the search for a grammar's shortest answer from its start looks at least this far for (bounded in work by
`grammar_closing.MAX_EXPANSIONS`; a few tenths of a second for a 60-key object), whatever the budget."""


def _llguidance():
    return require("llguidance", "grammar", purpose="grammar-constrained decoding")


class _TokenizerGrammars:
    """llguidance's view of one (tokenizer, vocab width, EOS ids), built once (about 1 s for a 49k vocabulary,
    several for 262k), and the grammars compiled for it."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]):
        import llguidance.hf

        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos_token_ids))
        self.vocab_size = vocab_size
        self.compiled: OrderedDict[tuple[str, str], GrammarConstraint] = OrderedDict()
        self._token_bytes: TokenBytes | None = None

    def token_bytes(self) -> TokenBytes:
        """The tokens as bytes, for the closing search (built on first use: a fraction of a second)."""
        if self._token_bytes is None:
            table = TokenBytes(self.tokenizer, self.vocab_size)
            with _LOCK:
                self._token_bytes = self._token_bytes or table
        return self._token_bytes


_LOCK = threading.Lock()
_PREPARED: weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], _TokenizerGrammars]] = (
    weakref.WeakKeyDictionary()
)
_EXECUTOR: Any = None


def _prepared(tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]) -> _TokenizerGrammars:
    key = (vocab_size, eos_token_ids)
    with _LOCK:
        entry = _PREPARED.setdefault(tokenizer, {}).get(key)
    if entry is None:
        entry = _TokenizerGrammars(tokenizer, vocab_size, eos_token_ids)  # outside the lock: it takes seconds
        with _LOCK:
            entry = _PREPARED[tokenizer].setdefault(key, entry)
    return entry


def _executor():
    """llguidance's thread pool that fills several rows' masks at once (the GIL is released meanwhile)."""
    global _EXECUTOR
    with _LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = _llguidance().LLExecutor(num_threads=max(1, min(os.cpu_count() or 1, 8)))
        return _EXECUTOR


def _schema_text(json_schema: Mapping[str, Any] | str | type) -> str:
    if isinstance(json_schema, type) and hasattr(json_schema, "model_json_schema"):  # a pydantic model class
        json_schema = json_schema.model_json_schema()
    if isinstance(json_schema, str):
        try:
            json_schema = json.loads(json_schema)
        except json.JSONDecodeError as err:
            raise ValueError(f"json_schema is not valid JSON: {err}") from None
    if not isinstance(json_schema, Mapping):
        raise TypeError(
            f"json_schema must be a dict, a JSON string or a pydantic model class, not {type(json_schema).__name__}"
        )
    return json.dumps(json_schema)  # key order kept: it is the order properties are written in


def _where(schema_text: str, reason: str) -> str:
    """Where in the schema the keywords llguidance does not implement sit (" at /properties/a: remove ..."), so
    the error names the field to fix."""
    match = re.search(r"Unimplemented keys: \[(.*?)\]", reason)
    if match is None:
        return ""
    keys = set(re.findall(r'"([^"]+)"', match.group(1)))
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            found.extend(f"{path or '/'} ({key})" for key in node if key in keys)
            for key, value in node.items():
                walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}/{i}")

    walk(json.loads(schema_text), "")
    if not found:
        return ""
    return f" at {', '.join(found)}: the grammar cannot enforce these keywords; remove them from the schema"


@dataclass(frozen=True, eq=False)
class GrammarConstraint:
    """A grammar compiled for one tokenizer and logits width: immutable, shared by every request that uses it.
    `start()` gives each request its own state."""

    kind: str
    """"json_schema", "regex", "grammar" (Lark or GBNF), or "any_text" (admits everything)."""
    source: str
    vocab_size: int | None
    """Logits columns it masks; None for any_text, which fits any width."""
    eos_token_ids: tuple[int, ...]
    _template: Any = field(repr=False, default=None)  # llguidance.LLMatcher at the start, copied by start()
    _tokens: Any = field(repr=False, default=None)  # the _TokenizerGrammars it was compiled for
    _shortest: dict = field(
        repr=False, default_factory=dict, compare=False
    )  # {"bound", "path"}: shortest_answer's search

    @classmethod
    def compile(
        cls,
        tokenizer,
        *,
        json_schema: Mapping[str, Any] | str | type | None = None,
        regex: str | None = None,
        grammar: str | None = None,
        vocab_size: int | None = None,
        eos_token_ids: int | Sequence[int] | None = None,
    ) -> GrammarConstraint:
        """Compile exactly one of `json_schema` (dict, JSON text or pydantic model class), `regex` or `grammar`
        (Lark or GBNF) for `tokenizer` (a fast Hugging Face tokenizer), or return the cached compile.
        `vocab_size`: the model's logits width when its output head is wider than the tokenizer (extra columns are
        refused); `eos_token_ids`: the tokens that end a request (default: the tokenizer's EOS)."""
        given = {
            k: v for k, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar)) if v is not None
        }
        if len(given) != 1:
            raise ValueError(f"pass exactly one of json_schema=, regex= or grammar= (got {sorted(given) or 'none'})")
        ((kind, value),) = given.items()
        source = _schema_text(value) if kind == "json_schema" else str(value)
        vocab_size, eos = cls._shape(tokenizer, vocab_size, eos_token_ids)
        llg = _llguidance()
        entry = _prepared(tokenizer, vocab_size, eos)
        with _LOCK:
            cached = entry.compiled.get((kind, source))
            if cached is not None:
                entry.compiled.move_to_end((kind, source))
                return cached
        if kind == "json_schema":
            try:
                check_schema_shape(json.loads(source))
            except ValueError as err:
                raise ValueError(f"invalid json schema: {err}") from None
            text = llg.LLMatcher.grammar_from_json_schema(source, defaults=JSON_OPTIONS)
        elif kind == "regex":
            try:
                check_pattern_limits(source)
            except ValueError as err:
                raise ValueError(f"invalid regex: {err}") from None
            text = llg.LLMatcher.grammar_from_regex(source)
        else:
            try:
                text = llg.grammar_from("grammar", source)
            except ValueError as err:
                raise ValueError(f"invalid grammar: {err}") from None
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(text, entry.tokenizer)
        template = None if failed else llg.LLMatcher(entry.tokenizer, text, log_level=0)
        if template is None or template.is_error():
            reason = (messages[0] if template is None else template.get_error()).strip()
            raise ValueError(
                f"invalid {kind.replace('_', ' ')}: {reason}{_where(source, reason) if kind == 'json_schema' else ''}"
            )
        constraint = cls(kind, source, vocab_size, eos, template, entry)
        with _LOCK:
            entry.compiled[(kind, source)] = constraint
            while len(entry.compiled) > CACHE_SIZE:
                entry.compiled.popitem(last=False)
        return constraint

    @classmethod
    def prepare(
        cls, tokenizer, *, vocab_size: int | None = None, eos_token_ids: int | Sequence[int] | None = None
    ) -> None:
        """Build llguidance's view of the tokenizer now, as the first compile would (1 s for 49k tokens, 10-20 s for
        262k on 2 CPU cores), e.g. from a background thread at model load. Same arguments as `compile`."""
        _llguidance()
        _prepared(tokenizer, *cls._shape(tokenizer, vocab_size, eos_token_ids))

    @classmethod
    def any_text(cls) -> GrammarConstraint:
        """The always-true grammar: its states admit every column, EOS and padding included, and never terminate."""
        return cls("any_text", "", None, ())

    @staticmethod
    def _shape(
        tokenizer, vocab_size: int | None, eos_token_ids: int | Sequence[int] | None
    ) -> tuple[int, tuple[int, ...]]:
        if vocab_size is None:
            vocab_size = len(tokenizer)
        if vocab_size < len(tokenizer):
            raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens")
        if eos_token_ids is None:
            eos_token_ids = tokenizer.eos_token_id
        if eos_token_ids is None:
            raise ValueError("the tokenizer has no EOS token: pass eos_token_ids=")
        eos = (eos_token_ids,) if isinstance(eos_token_ids, int) else tuple(eos_token_ids)
        if not eos or any(not 0 <= t < vocab_size for t in eos):
            raise ValueError(f"eos_token_ids {list(eos)} must be non-empty token ids below {vocab_size}")
        return vocab_size, eos

    def start(self) -> GrammarState:
        """A fresh state at the start of the grammar, for one request (or one row of a batch)."""
        return GrammarState(self, None if self._template is None else self._template.deep_copy())

    def shortest_answer(self, max_tokens: int = SHORTEST_SEARCH) -> list[int] | None:
        """A shortest complete answer of the grammar from its start, in tokens (`grammar_closing`; its length bounds
        the shortest from above, and is what the decoder forces under a budget), searched at least `max_tokens` (and
        SHORTEST_SEARCH) far; None when the search finds none ([] for any_text). Searched once per compiled grammar
        (again only for a farther bound after finding none); thread-safe. GrammarLimitExceeded where the search runs
        into a limit of llguidance (an object with about 500 optional properties, say)."""
        if self._template is None:
            return []
        if "limit" in self._shortest:
            raise GrammarLimitExceeded(self.kind, self._shortest["limit"])
        bound = max(max_tokens, SHORTEST_SEARCH)
        known = self._shortest.get("found")
        if known is not None and (known[1] is not None or known[0] >= bound):
            return None if known[1] is None else list(known[1])
        matcher = self._template.deep_copy()
        path = shortest_completion(matcher, self._tokens.token_bytes(), max_tokens=bound)
        if matcher.is_error():  # a limit of llguidance's parser or lexer, met on the way: every answer would meet it
            reason = matcher.get_error().strip().splitlines()[0]
            largest = largest_object(json.loads(self.source)) if self.kind == "json_schema" else None
            if largest is not None:
                reason += f" (the schema's largest object, at {largest[0]}, has {largest[1]} optional properties)"
            self._shortest["limit"] = reason
            raise GrammarLimitExceeded(self.kind, reason)
        self._shortest["found"] = (bound, path)  # one assignment: a racing search stores the same path
        return None if path is None else list(path)

    def check_budget(self, max_new_tokens: int) -> None:
        """BudgetBelowShortestAnswer where `max_new_tokens` is fewer than the tokens of the grammar's shortest complete
        answer (nothing is refused where the search finds none: an answer past its bounds of bytes and work; a count,
        as a minLength or minItems, it finds, `grammar_closing`)."""
        path = self.shortest_answer(max_new_tokens)
        if path is not None and len(path) > max_new_tokens:
            raise BudgetBelowShortestAnswer(self.kind, max_new_tokens, len(path))


class GrammarState:
    """One request's position in its grammar. Not thread-safe: owned by the loop that steps the request.

    Under a token budget (`reserve` before each step, `accept(token, left=...)` after it) the state never lets the
    answer be cut: it keeps a completion of the grammar from where it stands (`grammar_closing`), and once that
    completion needs every token left it forces it, token by token (`forced`). A token chosen earlier that would
    leave too few tokens to close is replaced by the completion's first token. `closed_early` tells either
    happened."""

    def __init__(self, constraint: GrammarConstraint, matcher: Any):
        self.constraint = constraint
        self._matcher = matcher
        self._terminated = False
        self.forced: int | None = None
        """The only token the next step admits (the next token of the completion), or None."""
        self.closed_early = False
        """Whether the decoder forced tokens of the grammar's completion to fit the budget."""
        self._path: list[int] | None = None  # a completion from here, searched when the budget gets near
        self._known: int | None = None  # length of the last completion found (None: not searched yet)
        self._retry_below: int | None = None  # after a failed search: look again once fewer tokens are left
        self._at_start = True  # no token accepted yet: the constraint's own search from the start applies
        self.budget_short: int | None = None
        """The tokens the grammar's shortest answer needs, where the budget is smaller: it cannot close (a request
        built by the decoder is refused instead, `GrammarConstraint.check_budget`)."""

    def reserve(self, left: int) -> None:
        """Before a step with `left` tokens left (this step's included): know a completion once the budget is
        near, and force its next token when it needs all of them. Host work only; none far from the budget."""
        self.forced = None
        if self._matcher is None or self._terminated or left < 1:
            return
        if self._matcher.is_accepting():
            self._path = []
            return
        if self._path is None and self._near(left) and (self._retry_below is None or left < self._retry_below):
            self._search(left)
        if self._path and len(self._path) >= left:
            self.forced = self._path[0]

    def _near(self, left: int) -> bool:
        """Whether `left` tokens are few enough to look for a completion: always at the first step (its length
        sets the horizon), then within HORIZON tokens of the last completion found."""
        return self._known is None or left <= self._known + HORIZON

    def completion(self, max_tokens: int = 64) -> list[int] | None:
        """A shortest completion of the grammar from here, in tokens (`grammar_closing`), or None when the search
        finds none of at most about `max_tokens`; [] where the text is already complete."""
        if self._matcher is None or self._terminated or self._matcher.is_accepting():
            return []
        return shortest_completion(self._matcher, self.constraint._tokens.token_bytes(), max_tokens=max_tokens)

    def _search(self, left: int) -> None:
        first = self._known is None
        self._path = self.constraint.shortest_answer(left) if self._at_start else self.completion(left)
        if first and self._path is not None and len(self._path) > left:
            self.budget_short = len(self._path)
        if self._path is None:
            self._retry_below, self._known = left - RETRY, self._known or 0
        else:
            self._known, self._retry_below = len(self._path), None

    def accept(self, token_id: int, *, left: int | None = None) -> int:
        """Advance past the chosen token; GrammarViolation if the grammar refuses it (its mask was not applied).
        With `left` (tokens left after this one), a token after which the grammar cannot close in `left` tokens is
        replaced by the next token of the completion. Returns the token taken."""
        if self._matcher is None:
            return token_id
        if self._terminated:
            if token_id in self.constraint.eos_token_ids:
                return token_id
            raise GrammarViolation(f"token {token_id} after the grammar ended with EOS")
        before, self.forced, self._at_start = self._path, None, False
        if not self._matcher.consume_token(token_id):
            raise GrammarViolation(
                f"the {self.constraint.kind.replace('_', ' ')} refuses token {token_id}: "
                f"{self._matcher.get_error().splitlines()[0]}"
            )
        self._terminated = token_id in self.constraint.eos_token_ids
        if before and token_id == before[0]:
            self._path = before[1:]
            self.closed_early = self.closed_early or (left is not None and len(before) > left)
        elif before is not None and not completes(self._matcher, before):
            self._path = None
        if left is None or self._terminated or before is None:
            return token_id
        if self._matcher.is_accepting():
            self._path = []
            return token_id
        if (self._path is None or len(self._path) > left) and self._near(left):
            self._search(left)
        if self._path is not None and len(self._path) <= left:
            return token_id
        if self._path is None and len(before) <= left:
            return token_id  # no completion found from here, but the one before still fits later: go on
        # no room left to close after it: take the completion's next token instead (EOS where it was complete)
        self._matcher.rollback(1)
        replacement = before[0] if before else self.constraint.eos_token_ids[0]
        self._matcher.consume_token(replacement)
        self._terminated, self._path, self.closed_early = not before, before[1:], True
        return replacement

    def is_complete(self) -> bool:
        """Whether the text so far is a whole match, so EOS is admitted now."""
        return self._matcher is None or self._terminated or self._matcher.is_accepting()

    def is_terminated(self) -> bool:
        """Whether EOS has been accepted (never, for any_text)."""
        return self._terminated

    def mask_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Set the refused tokens of a [V] or [1, V] logits tensor to -inf in place; returns it."""
        mask_logits_rows([self], logits.view(1, -1))
        return logits

    def _fill_only(self, row: torch.Tensor, tokens: Sequence[int]) -> None:
        words: dict[int, int] = {}
        for t in tokens:
            words[t // 32] = words.get(t // 32, 0) | 1 << (t % 32)
        row.zero_()
        for w, bits in words.items():
            row[w] = bits - (1 << 32) if bits >= 1 << 31 else bits  # as a signed int32


def fill_bitmask(states: Sequence[GrammarState | None], bitmask: torch.Tensor) -> None:
    """Fill the host bitmask [n, ceil(V/32)], row i from states[i] (None or any_text: every bit set)."""
    bitmask.fill_(-1)
    live = []
    for row, state in enumerate(states):
        if state is None or state._matcher is None:
            continue
        vocab = state.constraint.vocab_size
        if bitmask.shape[1] != bitmask_width(vocab):  # type: ignore[arg-type]  # set once compiled
            raise ValueError(
                f"row {row}: the grammar was compiled for {vocab} logits columns, not "
                f"{bitmask.shape[1] * 32} (pass vocab_size= the logits width to GrammarConstraint.compile)"
            )
        if state._terminated:
            state._fill_only(bitmask[row], state.constraint.eos_token_ids)
        elif state.forced is not None:
            state._fill_only(bitmask[row], [state.forced])
        else:
            live.append((state._matcher, row))
    if len(live) == 1:
        matcher, row = live[0]
        matcher.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), bitmask.shape[1] * 4)
    elif live:
        _executor().unsafe_compute_mask_ptr(live, bitmask.data_ptr(), bitmask.shape[1] * 4, bitmask.shape[0])
    for matcher, row in live:  # a dead end puts llguidance in its error state
        if matcher.is_error():
            raise GrammarViolation(
                f"row {row}: no token can continue the grammar: {matcher.get_error().splitlines()[0]}"
            )


def mask_logits_rows(states: Sequence[GrammarState | None], logits: torch.Tensor) -> torch.Tensor:
    """Mask each row of logits [n, V] (any device) with its own state (None: untouched) in one go: the host
    bitmask is filled in parallel, copied once and applied by one masked_fill. In place; returns `logits`."""
    if logits.dim() != 2 or logits.shape[0] != len(states):
        raise ValueError(f"logits {tuple(logits.shape)} must be [n, V] with n = {len(states)} states")
    vocab = logits.shape[1]
    for state in states:
        if state is not None and state.constraint.vocab_size not in (None, vocab):
            raise ValueError(
                f"the grammar was compiled for {state.constraint.vocab_size} logits columns, the logits "
                f"have {vocab}: pass vocab_size={vocab} to GrammarConstraint.compile"
            )
    if all(state is None for state in states):
        return logits
    bitmask = allocate_bitmask(len(states), vocab, for_device=logits.device)
    fill_bitmask(states, bitmask)
    return apply_bitmask(logits, bitmask)
