"""Grammar-constrained decoding: constrained output parses and validates, an always-true grammar changes nothing,
EOS only where the structure is complete, batched masks equal per-row masks, padding columns refused."""

from __future__ import annotations

import json
import re
import sys

import jsonschema
import pytest
import torch

from fides_rag import load_model
from fides_rag.extras import MissingExtraError
from fides_rag.generation.grammar.constraint import GrammarConstraint, GrammarViolation, mask_logits_rows
from fides_rag.generation.grammar.processor import GrammarLogitsProcessor
from fides_rag.testing import build_tiny_model

# Every string, number and list is bounded, so even a random-weight model must close the document in time.
ANSWER = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 8},
        "confident": {"type": "boolean"},
        "source": {"enum": ["document", "memory"]},
    },
    "required": ["answer", "confident", "source"],
    "additionalProperties": False,
}
TOOL_CALL = {
    "type": "object",
    "properties": {
        "name": {"enum": ["search", "weather"]},
        "arguments": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "maxLength": 6},
                "top_k": {"type": "integer", "minimum": 1, "maximum": 9},
                "filters": {
                    "type": "object",
                    "properties": {"source": {"enum": ["wiki", "news"]}, "recent": {"type": "boolean"}},
                    "required": ["source", "recent"],
                    "additionalProperties": False,
                },
            },
            "required": ["query", "top_k", "filters"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
PROMPT = "Question: What is the capital of France? Answer:"


def constrained_generate(model, tokenizer, constraint, prompt=PROMPT, max_new_tokens=120, **kwargs) -> list[int]:
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=not tokenizer.chat_template).input_ids
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        logits_processor=[GrammarLogitsProcessor(constraint)],
        max_new_tokens=max_new_tokens,
        do_sample=False,
        **kwargs,
    )
    return out[0, ids.shape[1] :].tolist()


def admitted(state, vocab: int) -> torch.Tensor:
    """Bool [V]: the tokens `state` admits now."""
    return torch.isfinite(state.mask_logits(torch.zeros(vocab)))


def decoded_json(tokenizer, tokens: list[int], schema: dict):
    assert tokens[-1] == tokenizer.eos_token_id, f"the document did not end: {tokenizer.decode(tokens)!r}"
    doc = json.loads(tokenizer.decode(tokens[:-1]))
    jsonschema.validate(doc, schema)
    return doc


# ---------------------------------------------------------------- fast: tiny tokenizer and tiny models


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize("schema", [ANSWER, TOOL_CALL], ids=["answer", "tool_call"])
def test_generate_under_a_json_schema_yields_valid_json(tiny_models, tokenizer, family, schema):
    constraint = GrammarConstraint.compile(tokenizer, json_schema=schema)
    tokens = constrained_generate(tiny_models[family], tokenizer, constraint)
    decoded_json(tokenizer, tokens, schema)


def test_sampled_rows_with_different_schemas_in_one_batch_all_validate(tiny_llama, tokenizer):
    constraints = [GrammarConstraint.compile(tokenizer, json_schema=s) for s in (ANSWER, TOOL_CALL)]
    batch = tokenizer([PROMPT, "Call a tool:"], return_tensors="pt", padding=True, padding_side="left")
    torch.manual_seed(0)
    out = tiny_llama.generate(
        **batch,
        logits_processor=[GrammarLogitsProcessor(constraints)],
        max_new_tokens=120,
        do_sample=True,
        temperature=1.5,
    )
    for row, schema in zip(out[:, batch.input_ids.shape[1] :].tolist(), (ANSWER, TOOL_CALL)):
        end = row.index(tokenizer.eos_token_id)
        jsonschema.validate(json.loads(tokenizer.decode(row[:end])), schema)


def test_a_pydantic_model_class_is_its_json_schema(tiny_llama, tokenizer):
    pydantic = pytest.importorskip("pydantic")

    class Answer(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")  # else the schema admits any further property
        answer: str = pydantic.Field(max_length=10)
        year: int = pydantic.Field(ge=1000, le=2100)

    constraint = GrammarConstraint.compile(tokenizer, json_schema=Answer)
    tokens = constrained_generate(tiny_llama, tokenizer, constraint)
    parsed = Answer.model_validate_json(tokenizer.decode(tokens[:-1]))
    assert 1000 <= parsed.year <= 2100


def test_regex_and_lark_grammars_constrain_generate(tiny_llama, tokenizer):
    regex = GrammarConstraint.compile(tokenizer, regex=r"(Lyon|Paris), [0-9]{2}")
    text = tokenizer.decode(constrained_generate(tiny_llama, tokenizer, regex)[:-1])
    assert re.fullmatch(r"(Lyon|Paris), [0-9]{2}", text), text
    lark = GrammarConstraint.compile(
        tokenizer, grammar='start: city " is " ("large" | "small")\ncity: "Lyon" | "Canberra"'
    )
    text = tokenizer.decode(constrained_generate(tiny_llama, tokenizer, lark)[:-1])
    assert re.fullmatch(r"(Lyon|Canberra) is (large|small)", text), text


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_always_true_grammar_leaves_greedy_decoding_unchanged(tiny_models, tokenizer, family):
    model = tiny_models[family]
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False)
    masked = constrained_generate(model, tokenizer, GrammarConstraint.any_text(), max_new_tokens=20)
    assert masked == plain[0, ids.shape[1] :].tolist()


def test_always_true_mask_admits_every_column():
    logits = torch.randn(3, 1000)
    states = [GrammarConstraint.any_text().start() for _ in range(3)]
    assert torch.equal(mask_logits_rows(states, logits.clone()), logits)


def test_eos_only_where_the_document_is_complete_then_forced(tokenizer):
    constraint = GrammarConstraint.compile(
        tokenizer,
        json_schema={
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "required": ["a"],
            "additionalProperties": False,
        },
    )
    state, vocab, eos = constraint.start(), len(tokenizer), tokenizer.eos_token_id
    ids = tokenizer.encode('{"a": "Lyon"}', add_special_tokens=False)
    for token in ids:
        allowed = admitted(state, vocab)
        assert allowed[token] and not allowed[eos] and not state.is_complete()
        state.accept(token)
    assert state.is_complete() and not state.is_terminated()
    assert admitted(state, vocab).nonzero().flatten().tolist() == [eos]  # nothing may follow the closing brace
    state.accept(eos)
    assert state.is_terminated()
    assert admitted(state, vocab).nonzero().flatten().tolist() == [eos]
    state.accept(eos)  # a finished row may keep emitting EOS
    with pytest.raises(GrammarViolation, match="after the grammar ended"):
        state.accept(ids[0])


def test_a_refused_token_raises(tokenizer):
    state = GrammarConstraint.compile(tokenizer, regex="Lyon").start()
    wrong = tokenizer.encode("Paris", add_special_tokens=False)[0]
    assert not admitted(state, len(tokenizer))[wrong]
    with pytest.raises(GrammarViolation, match="refuses token"):
        state.accept(wrong)


def test_batched_masks_equal_per_row_masks(tokenizer):
    vocab = len(tokenizer)
    schema = GrammarConstraint.compile(tokenizer, json_schema=TOOL_CALL)
    regex = GrammarConstraint.compile(tokenizer, regex=r"[a-z]+ [0-9]+")
    done = GrammarConstraint.compile(tokenizer, regex="Lyon").start()
    for token in tokenizer.encode("Lyon", add_special_tokens=False) + [tokenizer.eos_token_id]:
        done.accept(token)
    mid = schema.start()
    for token in tokenizer.encode('{"name": "weather", "arguments": {"query": "Ly', add_special_tokens=False):
        mid.accept(token)
    states = [schema.start(), mid, regex.start(), None, GrammarConstraint.any_text().start(), done, schema.start()]
    logits = torch.randn(len(states), vocab)
    batched = mask_logits_rows(states, logits.clone())
    for row, state in enumerate(states):
        alone = logits[row].clone() if state is None else state.mask_logits(logits[row].clone())
        assert torch.equal(batched[row], alone), row
    assert 1 < int(torch.isfinite(batched[1]).sum()) < vocab  # the rows differ: a string in progress ...
    assert int(torch.isfinite(batched[0]).sum()) == 1  # ... and the opening brace alone
    assert torch.equal(batched[3], logits[3]) and torch.equal(batched[4], logits[4])


def test_mask_logits_takes_one_row_of_either_shape_in_place(tokenizer):
    state = GrammarConstraint.compile(tokenizer, regex="Lyon").start()
    flat, row = torch.randn(len(tokenizer)), torch.randn(1, len(tokenizer))
    assert state.mask_logits(flat) is flat and state.mask_logits(row) is row
    assert int(torch.isfinite(flat).sum()) == int(torch.isfinite(row).sum()) >= 1


def test_padding_columns_of_a_wider_head_are_refused(tokenizer):
    wide = len(tokenizer) + 40
    model = build_tiny_model("llama", wide)
    constraint = GrammarConstraint.compile(tokenizer, json_schema=ANSWER, vocab_size=wide)
    logits = torch.zeros(wide)
    logits[len(tokenizer) :] = 100.0  # the padding columns would win without the mask
    assert torch.isinf(constraint.start().mask_logits(logits)[len(tokenizer) :]).all()
    decoded_json(tokenizer, constrained_generate(model, tokenizer, constraint), ANSWER)
    with pytest.raises(ValueError, match=f"vocab_size={wide}"):
        GrammarConstraint.compile(tokenizer, json_schema=ANSWER).start().mask_logits(torch.zeros(wide))


def test_compiles_are_cached_and_schema_forms_agree(tokenizer):
    a = GrammarConstraint.compile(tokenizer, json_schema=ANSWER)
    assert GrammarConstraint.compile(tokenizer, json_schema=json.dumps(ANSWER, indent=2)) is a
    assert GrammarConstraint.compile(tokenizer, json_schema=TOOL_CALL) is not a
    assert GrammarConstraint.compile(tokenizer, json_schema=ANSWER, eos_token_ids=[1, 3]) is not a
    first, second = a.start(), a.start()
    first.accept(tokenizer.encode("{", add_special_tokens=False)[0])
    assert (
        not admitted(second, len(tokenizer))[tokenizer.eos_token_id]
        and int(admitted(second, len(tokenizer)).sum()) == 1
    )
    assert not torch.equal(admitted(first, len(tokenizer)), admitted(second, len(tokenizer)))  # states are independent


def test_bad_input_is_refused_with_what_to_fix(tokenizer):
    with pytest.raises(ValueError, match="exactly one of"):
        GrammarConstraint.compile(tokenizer, json_schema=ANSWER, regex="a")
    with pytest.raises(ValueError, match="exactly one of"):
        GrammarConstraint.compile(tokenizer)
    with pytest.raises(ValueError, match="invalid json schema"):
        GrammarConstraint.compile(tokenizer, json_schema={"type": "object", "properties": {"a": {"type": "strin"}}})
    with pytest.raises(
        ValueError,
        match=r"invalid json schema: the schema at / leads into a reference cycle with no content \(#/\$defs/A -> "
        r"#/\$defs/A\)",
    ):
        GrammarConstraint.compile(tokenizer, json_schema={"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"})
    with pytest.raises(ValueError, match="invalid regex"):
        GrammarConstraint.compile(tokenizer, regex="[a-")
    with pytest.raises(ValueError, match="invalid grammar"):
        GrammarConstraint.compile(tokenizer, grammar="start: undefined_rule")
    with pytest.raises(ValueError, match="not valid JSON"):
        GrammarConstraint.compile(tokenizer, json_schema='{"type": object}')
    with pytest.raises(TypeError, match="pydantic model class"):
        GrammarConstraint.compile(tokenizer, json_schema=[1, 2])
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        GrammarConstraint.compile(tokenizer, regex="a", vocab_size=10)


def test_a_grammar_past_the_grammar_librarys_limits_is_refused_before_decoding(tokenizer):
    from fides_rag.generation.grammar.constraint import GrammarLimitExceeded

    with pytest.raises(
        ValueError, match="the object at / lists 10000 properties, more than the grammar's limit of 1000"
    ):
        GrammarConstraint.compile(
            tokenizer,
            json_schema={"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}},
        )
    with pytest.raises(ValueError, match="invalid regex: the pattern at regex repeats 1000000 times"):
        GrammarConstraint.compile(tokenizer, regex="a{1000000}")
    with pytest.raises(ValueError, match="no finite JSON value"):
        GrammarConstraint.compile(
            tokenizer, json_schema={"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
        )
    wide = GrammarConstraint.compile(
        tokenizer, json_schema={"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(600)}}
    )
    for _ in range(2):  # the second time from what the first search learned
        with pytest.raises(
            GrammarLimitExceeded,
            match=r"past a limit of the grammar library: .*largest object, at /, has 600 optional properties",
        ) as err:
            wide.check_budget(64)
        assert err.value.field == "json_schema"


def test_a_missing_extra_names_the_install_command(tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance now fails as if it were absent
    with pytest.raises(MissingExtraError, match=r'pip install "fides-rag\[grammar\]"'):
        GrammarConstraint.compile(tokenizer, regex="a")


def test_a_processor_serves_one_generate_call(tiny_llama, tokenizer):
    processor = GrammarLogitsProcessor(GrammarConstraint.compile(tokenizer, json_schema=ANSWER))
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    tiny_llama.generate(
        ids, attention_mask=torch.ones_like(ids), logits_processor=[processor], max_new_tokens=4, do_sample=False
    )
    with pytest.raises(ValueError, match="one generate call"):
        tiny_llama.generate(ids, attention_mask=torch.ones_like(ids), logits_processor=[processor], max_new_tokens=4)


# ---------------------------------------------------------------- slow: the real backbones and their tokenizers

REAL_ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 40}},
    "required": ["answer"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma3-270m"])
def backbone(request):
    return load_model(request.param, device="cpu")


def real_prompt(tokenizer) -> str:
    question = (
        "Document: Lyon is the capital of France.\nQuestion: What is the capital of France? "
        'Reply with JSON like {"answer": "..."}.'
    )
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
    return question + "\nJSON:"


@pytest.mark.slow
@pytest.mark.parametrize("schema", [REAL_ANSWER, TOOL_CALL], ids=["answer", "tool_call"])
def test_real_backbone_output_under_a_json_schema_validates(backbone, schema):
    model, tokenizer = backbone
    constraint = GrammarConstraint.compile(
        tokenizer, json_schema=schema, vocab_size=model.get_output_embeddings().weight.shape[0]
    )
    tokens = constrained_generate(model, tokenizer, constraint, prompt=real_prompt(tokenizer), max_new_tokens=90)
    doc = decoded_json(tokenizer, tokens, schema)
    print(f"\n{model.config.model_type}: {doc}")


@pytest.mark.slow
def test_real_backbone_always_true_grammar_leaves_greedy_decoding_unchanged(backbone):
    model, tokenizer = backbone
    ids = tokenizer(real_prompt(tokenizer), return_tensors="pt", add_special_tokens=False).input_ids
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
    masked = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=16,
        do_sample=False,
        logits_processor=[GrammarLogitsProcessor(GrammarConstraint.any_text())],
    )
    assert masked.tolist() == plain.tolist()


@pytest.mark.slow
def test_real_tokenizer_eos_and_batched_masks(backbone):
    model, tokenizer = backbone
    vocab = model.get_output_embeddings().weight.shape[0]
    constraint = GrammarConstraint.compile(tokenizer, json_schema=TOOL_CALL, vocab_size=vocab)
    text = json.dumps(
        {
            "name": "weather",
            "arguments": {"query": "été 😀", "top_k": 3, "filters": {"source": "news", "recent": True}},
        },
        ensure_ascii=False,
    )
    ids, eos = tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id
    walker, states = constraint.start(), []
    for position, token in enumerate(ids):
        if position % 4 == 0:
            states.append(constraint.start())
            for earlier in ids[:position]:
                states[-1].accept(earlier)
        allowed = admitted(walker, vocab)
        assert allowed[token] and not allowed[eos], (position, tokenizer.decode(ids[: position + 1]))
        walker.accept(token)
    assert admitted(walker, vocab).nonzero().flatten().tolist() == [eos]
    states += [None, GrammarConstraint.any_text().start(), walker]
    logits = torch.randn(len(states), vocab)
    batched = mask_logits_rows(states, logits.clone())
    for row, state in enumerate(states):
        alone = logits[row].clone() if state is None else state.mask_logits(logits[row].clone())
        assert torch.equal(batched[row], alone), row


def test_a_schema_keyword_the_grammar_cannot_enforce_is_refused_with_where_it_is(tokenizer):
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    }
    with pytest.raises(ValueError, match=r"uniqueItems.* at /properties/tags \(uniqueItems\): .*remove them"):
        GrammarConstraint.compile(tokenizer, json_schema=schema)
