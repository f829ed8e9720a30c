"""The one request builder: a question with its documents, a prompt pair, or a prepared example, with its
method(s) and options, becomes a `Request` the engine can decode: rules resolved, settings validated, prompts
tokenised, the no-documents fallback noted, per-document paths checked and masked heads set up. Every entry
point (the decoder's calls, the request batcher, the integrations, the server) builds its requests here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fides_rag.generation.paths import Heads, prompt_ids
from fides_rag.generation.prompting import PreparedExample, PromptPreparer
from fides_rag.generation.settings import GenerationSettings
from fides_rag.generation.validation import check_document_paths, refuse_document_paths
from fides_rag.prompts.answer_text import AnswerText
from fides_rag.rules import ContrastRule, get_method, split_method

Methods = Sequence["str | ContrastRule"] | Mapping[str, "str | ContrastRule"]


@dataclass(frozen=True)
class PromptPair:
    """Two prompts written outside fides-rag's template (a framework's own prompt, say): the context path's
    and the no-context path's. They are tokenised as given, with no templating and no trimming.

    >>> PromptPair(context="Lyon is the capital of France.\\nQ: capital?\\nA:", no_context="Q: capital?\\nA:")
    """

    context: str
    no_context: str
    add_special_tokens: bool = True
    """Whether the tokenizer adds its special tokens (BOS); False for text that already holds them."""
    untrusted: tuple[str, ...] = ()
    """Texts inside the prompts (the documents, the question) to tokenise as plain text: special-token text in them
    (a retrieved page holding "<|im_end|>") never becomes a control token; the rest (a chat template's markup) as
    given."""


Prompt = "str | PromptPair | PreparedExample"


@dataclass
class MethodRun:
    """One method of a request: what was asked for, what decodes it, and its masked heads."""

    label: str
    requested: ContrastRule
    effective: ContrastRule
    """'standard' when the example has no documents, else `requested`."""
    heads: Heads | None = None


@dataclass
class Request:
    """One example under one or more methods, ready to decode; `methods[i]` decodes as `units[i]` in the engine.

    Methods whose effective rule is the same object (every method of an example without documents falls
    back to 'standard') decode once and report under each label (`unit_of`)."""

    example: PreparedExample
    methods: list[MethodRun]
    settings: GenerationSettings
    streams: bool = False
    several: bool = False
    """Asked with methods=: its result is label -> result even for one label."""
    constraint: Any = None
    """The compiled grammar (`GrammarConstraint`) the answer is held to, or None."""
    unit_of: list[int] = field(default_factory=list)
    """methods[i] is decoded by distinct effective rule number unit_of[i]."""

    def __post_init__(self) -> None:
        distinct: list[int] = []  # index into methods of each distinct effective rule
        for i, method in enumerate(self.methods):
            same = next((k for k, j in enumerate(distinct) if self.methods[j].effective is method.effective), None)
            if same is None:
                distinct.append(i)
                same = len(distinct) - 1
            self.unit_of.append(same)
        self._distinct = distinct

    @property
    def decoded(self) -> list[MethodRun]:
        """The methods that decode a unit of their own (one per distinct effective rule)."""
        return [self.methods[i] for i in self._distinct]

    @property
    def rows(self) -> int:
        """Batch rows this request holds while decoding (every path of every distinct method)."""
        return sum(len(prompt_ids(run.effective, self.example, run.heads)) for run in self.decoded)

    @property
    def text_stops(self) -> tuple[str, ...]:
        """The stop strings matched in the answer's text: none for a structured answer, whose grammar decides where it
        ends (a stop string could match inside it, as "a" in a key, and cut it mid-structure; a stop that is one
        special token ends the grammar as EOS does, `RequestBuilder.constraint`)."""
        if self.constraint is not None and self.constraint.kind != "any_text":
            return ()
        return tuple(self.example.stop) + tuple(self.settings.stop)

    @property
    def answer_text(self) -> AnswerText | None:
        """What cuts the answer's text (template leftovers, markup, role lines); None for a structured answer, whose
        grammar decides its text."""
        if self.constraint is not None and self.constraint.kind != "any_text":
            return None
        return AnswerText(self.example.template)

    def kv_blocks(self, block: int) -> int:
        """Blocks of `block` positions of fast mode's KV pool this request may hold at most: each row's prompt plus
        the token budget, rounded up to whole blocks, row by row (a row every method takes a copy of counts per
        method)."""
        budget = self.settings.max_new_tokens
        return sum(
            -(-(len(ids) + budget) // block)
            for run in self.decoded
            for ids in prompt_ids(run.effective, self.example, run.heads)
        )

    @property
    def tokens(self) -> int:
        """KV positions this request may hold at most: each row's prompt plus the token budget."""
        budget = self.settings.max_new_tokens
        total = 0
        for run in self.decoded:
            for ids in prompt_ids(run.effective, self.example, run.heads):
                total += len(ids) + budget
        return total


def special_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of `text` where it is one special token of `tokenizer` (an end-of-turn token such as <|im_end|>), else
    None."""
    ids = tokenizer.encode(text, add_special_tokens=False)  # special-token text becomes its one id
    special = set(getattr(tokenizer, "all_special_ids", ())) | {
        i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special
    }
    return int(ids[0]) if len(ids) == 1 and ids[0] != tokenizer.unk_token_id and ids[0] in special else None


class RequestBuilder:
    """Builds `Request`s with one prompt preparer, one default method and token budget, and the engine's head setup."""

    def __init__(
        self,
        preparer: PromptPreparer,
        default_method: ContrastRule,
        default_max_new_tokens: int,
        setup_heads: Any,
        vocab_size: int | None = None,
        eos_token_ids: Any = None,
    ) -> None:
        self.preparer = preparer
        self.default_method = default_method
        self.default_max_new_tokens = default_max_new_tokens
        self._setup_heads = setup_heads
        """(rules) -> one Heads or None per rule: the rules' setup hook, run under the engine's model lock."""
        self.vocab_size = vocab_size
        """The model's logits width (grammars mask every column)."""
        self.eos_token_ids = eos_token_ids
        """() -> the ids that end an answer (grammars admit them only where the structure is complete)."""

    def constraint(self, settings: GenerationSettings, stops: Sequence[str] = ()) -> Any:
        """The compiled grammar of `settings` (cached per tokenizer and grammar), or None. Every stop string of the
        request that is one special token (an end-of-turn token, say) ends the grammar as EOS does: admitted only where
        the structure is complete, so it cannot cut the answer mid-structure. Other stop strings are not matched in a
        structured answer (`Request.text_stops`): an ordinary token as the grammar's end could not appear in it."""
        if not settings.constrained:
            return None
        from fides_rag.generation.grammar.constraint import GrammarConstraint

        if isinstance(settings.grammar, GrammarConstraint):
            return settings.grammar
        spec = {
            name: getattr(settings, name)
            for name in ("json_schema", "regex", "grammar")
            if getattr(settings, name) is not None
        }
        ends = set(self.eos_token_ids()) | self._stop_tokens(stops)
        return GrammarConstraint.compile(
            self.preparer.tokenizer, vocab_size=self.vocab_size, eos_token_ids=sorted(ends), **spec
        )

    def _stop_tokens(self, stops: Sequence[str]) -> set[int]:
        tokenizer = self.preparer.tokenizer
        return {token for token in (special_token_id(tokenizer, stop) for stop in stops) if token is not None}

    def resolve(self, method: str | ContrastRule | None) -> ContrastRule:
        """A rule object for `method`; None, or the default rule's name, gives the configured default rule, and that
        name behind a gate (`fides+agree`) the configured rule behind the gate."""
        if method is None or (isinstance(method, str) and method == self.default_method.name):
            return self.default_method
        if isinstance(method, str):
            rule, gate = split_method(method)
            if gate is not None and rule == self.default_method.name:
                return get_method(self.default_method, gate=gate)
        return get_method(method)

    def labelled(self, method: str | ContrastRule | None, methods: Methods | None) -> dict[str, ContrastRule]:
        """label -> rule for a call's `method=` or `methods=` (a list of names/rules, or a mapping label -> method)."""
        if methods is None:
            rule = self.resolve(method)
            return {rule.name: rule}
        if method is not None:
            raise ValueError("give method= or methods=, not both")
        if isinstance(methods, str):
            raise TypeError("methods= takes a list of methods or a mapping label -> method; use method= for one")
        if isinstance(methods, Mapping):
            labelled = {str(label): self.resolve(m) for label, m in methods.items()}
        else:
            rules = [self.resolve(m) for m in methods]
            labels = [r.name for r in rules]
            if len(set(labels)) != len(labels):
                raise ValueError(f"methods {labels} repeat a name; pass a mapping label -> method to tell them apart")
            labelled = dict(zip(labels, rules))
        if not labelled:
            raise ValueError("methods must name at least one method")
        return labelled

    def prepare(
        self, prompt: Any, documents: Any, rules: Sequence[ContrastRule], max_new_tokens: int
    ) -> PreparedExample:
        """Tokenise one example: a question with its documents, a `PromptPair`, or an already `PreparedExample`."""
        if isinstance(prompt, PreparedExample):
            if documents is not None:
                raise ValueError("a PreparedExample already holds its documents; do not pass documents= with it")
            return prompt
        if isinstance(prompt, PromptPair):
            if documents is not None:
                raise ValueError(
                    "a PromptPair already holds its documents in its context prompt; do not pass documents= with it"
                )
            for rule in rules:
                refuse_document_paths(rule)
            return self.preparer.prepare_from_prompts(
                prompt.context, prompt.no_context, max_new_tokens, prompt.add_special_tokens, untrusted=prompt.untrusted
            )
        document_paths = any(rule.needs_document_paths for rule in rules)
        return self.preparer.prepare(prompt, documents, max_new_tokens, document_paths=document_paths)

    def build(
        self,
        prompt: Any,
        documents: Any = None,
        *,
        method: str | ContrastRule | None = None,
        methods: Methods | None = None,
        stream: bool = False,
        **options: Any,
    ) -> Request:
        """One request; raises on bad input before anything is decoded."""
        return self._set_up([self._request(prompt, documents, method, methods, stream, options)])[0]

    def build_all(self, prompts: Sequence[Any], documents: Sequence[Any] | None, **kwargs: Any) -> list[Request]:
        """One request per prompt (`documents[i]` belongs to `prompts[i]`); every one is built before any decodes,
        and each rule's setup hook runs once for all of them."""
        if isinstance(prompts, (str, PromptPair)):
            raise TypeError("pass a list of questions (or PromptPairs); use generate for a single one")
        if documents is None:
            documents = [None] * len(prompts)
        if isinstance(documents, str) or len(documents) != len(prompts):
            count = 1 if isinstance(documents, str) else len(documents)
            raise ValueError(f"got {len(prompts)} questions but {count} document lists; pass one list per question")
        method, methods, stream = kwargs.pop("method", None), kwargs.pop("methods", None), kwargs.pop("stream", False)
        labelled = self.labelled(method, methods)  # the same rule objects for every prompt
        chosen = methods if methods is None else labelled
        requests = [
            self._request(
                p, d, None if methods is not None else next(iter(labelled.values())), chosen, stream, kwargs, i
            )
            for i, (p, d) in enumerate(zip(prompts, documents))
        ]
        return self._set_up(requests)

    def _request(
        self,
        prompt: Any,
        documents: Any,
        method: Any,
        methods: Any,
        stream: bool,
        options: dict[str, Any],
        number: int = 0,
    ) -> Request:
        labelled = self.labelled(method, methods)
        settings = GenerationSettings.build(self.default_max_new_tokens, options)
        example = self.prepare(prompt, documents, list(labelled.values()), settings.max_new_tokens)
        standard = get_method("standard") if not example.has_documents else None
        runs = [
            MethodRun(label, rule, standard or rule) for label, rule in labelled.items()
        ]  # one 'standard': decoded once
        if stream and methods is not None:
            raise ValueError("a stream decodes one method; pass method=, not methods=")
        constraint = self.constraint(settings, example.stop + settings.stop)
        if constraint is not None:
            constraint.check_budget(settings.max_new_tokens)  # an answer that could only be cut is refused, not decoded
        request = Request(example, runs, settings, streams=stream, several=methods is not None, constraint=constraint)
        check_document_paths([example], [run.effective for run in request.decoded], first=number)
        return request

    def _set_up(self, requests: list[Request]) -> list[Request]:
        """Each distinct rule's setup hook (masked heads), once, before anything decodes."""
        rules: list[ContrastRule] = []
        for request in requests:
            for run in request.decoded:
                if not any(run.effective is r for r in rules):
                    rules.append(run.effective)
        heads = self._setup_heads(rules)
        for request in requests:
            for run in request.methods:
                run.heads = heads[next(i for i, r in enumerate(rules) if r is run.effective)]
        return requests
