"""The decoder's extra paths on tiny models: one path per document (DVD) and a copy of the context path with
attention heads masked (DeCoRe). Each is checked against separate plain forwards with no cache, across
batching, split and joint prefill, several methods at once and pruning of finished rows; and bad input."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, StoppingCriteria, StoppingCriteriaList

from fides_rag import ContrastRule, FidesDecoder, PromptPair, PromptTemplate, UnsupportedArchitectureError
from fides_rag.method.lens import ModelAnatomy
from fides_rag.rules import StepOutput
from fides_rag.rules.dvd import DvdRule
from fides_rag.testing import MULTI_DOCUMENT_QUESTIONS, MULTI_DOCUMENTS, build_tiny_model

QUESTIONS, DOCUMENTS = MULTI_DOCUMENT_QUESTIONS, MULTI_DOCUMENTS
NO_STOP = PromptTemplate(stop=())  # no "\n" stop, and (with no_eos) no EOS: every generation runs its full length
HEADS = {1: (0, 2), 3: (1,)}


class DocumentProbe(ContrastRule):
    """Standard decoding that records the per-document logits of every step."""

    name = "document-probe"
    paths = ("context", "documents")

    def __init__(self) -> None:
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def combine(self, step):
        self.seen.append((step.document_logits.clone(), step.document_mask.clone()))
        return StepOutput(logits=step.ctx_logits)


class HeadProbe(ContrastRule):
    """Decodes from the masked-heads path (or the context path) and records both of every step."""

    name = "head-probe"
    paths = ("context", "masked_heads")

    def __init__(self, heads, follow_masked: bool = True) -> None:
        self.heads, self.follow_masked = heads, follow_masked
        self.asked = 0
        self.seen: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def masked_heads(self, model, tokenizer):
        self.asked += 1
        return self.heads

    def combine(self, step):
        masked = step.masked_logits
        self.seen.append((step.ctx_logits.clone(), None if masked is None else masked.clone()))
        return StepOutput(logits=masked if self.follow_masked and masked is not None else step.ctx_logits)


class StopOnResidue(StoppingCriteria):
    """Ends a row when its last token id is divisible by `modulus` (so rows finish at different steps)."""

    def __init__(self, modulus: int) -> None:
        self.modulus = modulus

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] % self.modulus == 0


class ForwardCounter:
    """Rows of every backbone forward, split into prompt chunks and decode steps.

    Each prompt row is prefilled in forwards of its own (one row), and a chunk can be one token wide, so a decode
    step is a one-token forward of several rows; the tests using this decode more than one row at every step."""

    def __init__(self, module) -> None:
        self.calls: list[tuple[int, int]] = []
        self.handle = module.register_forward_hook(
            lambda m, args, kwargs, out: self.calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
        )

    def split(self) -> tuple[list[int], list[int]]:
        decode = [r for r, w in self.calls if w == 1 and r > 1]
        return [r for r, w in self.calls if not (w == 1 and r > 1)], decode


def no_eos(decoder: FidesDecoder) -> FidesDecoder:
    """Never stop on EOS, so row b is example b at every step (random tiny models may emit it)."""
    decoder.eos_token_ids = set()
    return decoder


def last_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def hand_masked(model, heads):
    """Hooks that zero the given heads' slices of each listed layer's o_proj input, written out by hand."""
    config = model.config
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def zero(head_list):
        def hook(module, args):
            x = args[0].clone()
            for h in head_list:
                x[..., h * dim : (h + 1) * dim] = 0.0
            return (x,)

        return hook

    return [
        model.model.layers[layer - 1].self_attn.o_proj.register_forward_pre_hook(zero(hs))
        for layer, hs in heads.items()
    ]


# -- per-document paths ------------------------------------------------------------------------------


def test_prepare_document_prompts(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    assert decoder.prepare(QUESTIONS[1], DOCUMENTS[1], 8).document_ids is None  # only when a rule asks
    example = decoder.prepare(QUESTIONS[1], DOCUMENTS[1], 8, document_paths=True)
    assert len(example.document_prompts) == len(example.document_ids) == 3
    for text, prompt, ids in zip(DOCUMENTS[1], example.document_prompts, example.document_ids):
        block = decoder.prompts.template.document_block([text])
        assert prompt == decoder.prompts.template.render(
            tokenizer, QUESTIONS[1], block, decoder.prompts.use_chat_template
        )
        assert f"Document [1]: {text}\n" in prompt and "Document [2]" not in prompt
        assert ids == tokenizer(prompt)["input_ids"]
    assert example.context_ids == decoder.prepare(QUESTIONS[1], DOCUMENTS[1], 8).context_ids


@pytest.mark.parametrize("split_prefill", [True, False])
@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3"])
def test_document_paths_equal_separate_forwards(tiny_models, tokenizer, family, split_prefill):
    model = tiny_models[family]
    # a budget that holds every prompt: the examples join at the first step, so row b is example b at every step
    decoder = no_eos(
        FidesDecoder(
            model, tokenizer, prompt_template=NO_STOP, split_prefill=split_prefill, max_num_batched_tokens=8192
        )
    )
    probe = DocumentProbe()
    results = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=probe, max_new_tokens=4)
    standard = decoder.generate_batch(QUESTIONS, DOCUMENTS, method="standard", max_new_tokens=4)
    assert all(len(r.token_ids) == 4 for r in results)  # nobody finished early: row b is example b at every step
    assert len(probe.seen) == 4
    for b, (question, docs, result) in enumerate(zip(QUESTIONS, DOCUMENTS, results)):
        assert result.token_ids == standard[b].token_ids
        example = decoder.prepare(question, docs, 4, document_paths=True)
        for t, (doc_logits, present) in enumerate(probe.seen):
            assert doc_logits.shape[:2] == present.shape == (3, 4)
            assert present[b].tolist() == [n < len(docs) for n in range(4)]
            for n, ids in enumerate(example.document_ids):
                expected = last_logits(model, ids + result.token_ids[:t])
                torch.testing.assert_close(doc_logits[b, n], expected, rtol=1e-4, atol=1e-4)
            assert (doc_logits[b, len(docs) :] == 0).all()


def test_document_prompts_are_trimmed_like_the_context(tokenizer):
    model = build_tiny_model("llama", len(tokenizer), max_position_embeddings=400)
    decoder = FidesDecoder(model, tokenizer)
    long_doc, short_doc = "The capital of Australia is Melbourne. " * 200, "Canberra was chosen as a compromise."
    example = decoder.prepare("What is the capital?", [long_doc, short_doc], 20, document_paths=True)
    assert all(len(ids) + 20 <= 400 for ids in example.document_ids)
    assert any(note.startswith("document 1's own prompt trimmed") for note in example.notes)
    assert not any(note.startswith("document 2's") for note in example.notes)
    block = decoder.prompts.template.document_block([short_doc])
    assert example.document_prompts[1] == decoder.prompts.render("What is the capital?", block)[0]
    result = decoder.generate("What is the capital?", [long_doc, short_doc], method="dvd", max_new_tokens=20)
    assert result.method == "dvd" and result.documents_trimmed


# -- masked heads ----------------------------------------------------------------------------------


@pytest.mark.parametrize("split_prefill", [True, False])
@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3_text", "qwen3"])
def test_masked_path_equals_model_with_heads_zeroed_by_hand(tiny_models, tokenizer, family, split_prefill):
    """Decoding from the masked path gives the greedy tokens of the hand-masked model recomputed without a
    cache, and the context rows beside it stay unmasked."""
    model = tiny_models[family]
    # a budget that holds every prompt: the examples join at the first step, so row b is example b at every step
    decoder = no_eos(
        FidesDecoder(
            model, tokenizer, prompt_template=NO_STOP, split_prefill=split_prefill, max_num_batched_tokens=8192
        )
    )
    probe = HeadProbe(HEADS)
    results = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=probe, max_new_tokens=5)
    assert probe.asked == 1
    assert all(len(r.token_ids) == 5 for r in results)
    assert all(
        not proj._forward_pre_hooks for proj in ModelAnatomy.of(decoder.model).attention_output_projections()
    )  # hooks removed
    for b, (question, docs, result) in enumerate(zip(QUESTIONS, DOCUMENTS, results)):
        ids = decoder.prepare(question, docs, 5).context_ids
        handles = hand_masked(model, HEADS)
        try:
            masked = [last_logits(model, ids + result.token_ids[:t]) for t in range(5)]
        finally:
            for handle in handles:
                handle.remove()
        assert result.token_ids == [int(m.argmax()) for m in masked]
        for t, (ctx_logits, masked_logits) in enumerate(probe.seen):
            torch.testing.assert_close(masked_logits[b], masked[t], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(
                ctx_logits[b], last_logits(model, ids + result.token_ids[:t]), rtol=1e-4, atol=1e-4
            )
            assert not torch.allclose(ctx_logits[b], masked_logits[b], atol=1e-3)


def test_masked_path_batch_equals_single(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    batch = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=HeadProbe(HEADS), max_new_tokens=6)
    for question, docs, batched in zip(QUESTIONS, DOCUMENTS, batch):
        assert (
            batched.token_ids == decoder.generate(question, docs, method=HeadProbe(HEADS), max_new_tokens=6).token_ids
        )


def test_no_heads_means_no_masked_rows(tiny_llama, tokenizer):
    decoder = no_eos(FidesDecoder(tiny_llama, tokenizer, prompt_template=NO_STOP, max_num_batched_tokens=8192))
    contexts = sum(len(decoder.prepare(q, d, 3).context_ids) for q, d in zip(QUESTIONS, DOCUMENTS))
    for heads in (None, {}, {2: ()}):
        probe = HeadProbe(heads)
        counter = ForwardCounter(ModelAnatomy.of(decoder.model).backbone)
        before = decoder.stats.prompt_tokens
        try:
            result = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=probe, max_new_tokens=3)
        finally:
            counter.handle.remove()
        prefill, decode = counter.split()
        assert set(prefill) == {1} and decode == [3, 3]
        assert decoder.stats.prompt_tokens - before == contexts  # the context rows alone
        assert all(masked is None for _, masked in probe.seen)
        standard = decoder.generate_batch(QUESTIONS, DOCUMENTS, method="standard", max_new_tokens=3)
        assert [r.token_ids for r in result] == [r.token_ids for r in standard]


# -- all paths together -------------------------------------------------------------------------------


@pytest.mark.parametrize("split_prefill", [True, False])
def test_rows_per_forward(tiny_llama, tokenizer, split_prefill, monkeypatch):
    """Extra rows only for the rules that need them; one forward per step over every path; a single method
    with nobody finished keeps its rows in place (the cache is never reindexed)."""
    reindexed = []
    original = DynamicCache.batch_select_indices
    monkeypatch.setattr(
        DynamicCache, "batch_select_indices", lambda self, keep: reindexed.append(keep) or original(self, keep)
    )
    decoder = no_eos(
        FidesDecoder(
            tiny_llama, tokenizer, prompt_template=NO_STOP, split_prefill=split_prefill, max_num_batched_tokens=8192
        )
    )
    expected = {"cad": [3, 3], "dvd": [3, 3, 9], "heads": [3, 3]}  # documents: 2 + 3 + 4
    examples = [decoder.prepare(q, d, 4, document_paths=True) for q, d in zip(QUESTIONS, DOCUMENTS)]
    prompt_tokens = {  # every row's prompt, once
        "cad": sum(len(e.context_ids) + len(e.no_context_ids) for e in examples),
        "dvd": sum(len(e.context_ids) + len(e.no_context_ids) + sum(map(len, e.document_ids)) for e in examples),
        "heads": sum(2 * len(e.context_ids) for e in examples),
    }
    for label, method in (("cad", "cad"), ("dvd", DvdRule()), ("heads", HeadProbe(HEADS))):
        counter = ForwardCounter(ModelAnatomy.of(decoder.model).backbone)
        before = decoder.stats.prompt_tokens
        try:
            results = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=method, max_new_tokens=4)
        finally:
            counter.handle.remove()
        assert all(len(r.token_ids) == 4 for r in results)
        prefill, decode = counter.split()
        if split_prefill:  # each prompt row in its own forwards
            assert set(prefill) == {1} and decoder.stats.prompt_tokens - before == prompt_tokens[label]
        else:
            assert prefill == [sum(expected[label])]
        assert decode == [sum(expected[label])] * 3
    assert reindexed == []


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3_text"])
def test_split_prefill_equals_joint_prefill(tiny_models, tokenizer, family):
    """Three to five row groups merged into one cache (gemma2/gemma3: sliding-window layers shorter than the
    prompts)."""
    split = FidesDecoder(tiny_models[family], tokenizer, split_prefill=True)
    joint = FidesDecoder(tiny_models[family], tokenizer, split_prefill=False)
    methods = {"dvd": DvdRule(), "heads": HeadProbe(HEADS), "other-heads": HeadProbe({2: (3,)}), "cad": "cad"}
    a = split.generate_batch(QUESTIONS, DOCUMENTS, methods=methods, max_new_tokens=6, stop=[])
    b = joint.generate_batch(QUESTIONS, DOCUMENTS, methods=methods, max_new_tokens=6, stop=[])
    for label in methods:
        for x, y in zip(a[label], b[label]):
            assert x.token_ids == y.token_ids
            assert x.alphas == pytest.approx(y.alphas, abs=1e-4)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_lanes_with_every_path_and_pruning_equal_each_method_alone(tiny_models, tokenizer, family):
    """Two head sets (one shared by two lanes), the document paths and plain lanes in one decode, with rows
    finishing at different steps; each lane equals its method decoded alone."""
    decoder = FidesDecoder(tiny_models[family], tokenizer, prompt_template=NO_STOP, max_num_batched_tokens=8192)
    methods = {
        "heads-a": HeadProbe({1: (0,)}),
        "heads-b": HeadProbe({2: (1, 3), 4: (0,)}),
        "heads-a-again": HeadProbe({1: (0,)}, follow_masked=False),
        "dvd": "dvd",
        "cad": "cad",
        "standard": "standard",
        "dola": "dola",
    }
    kwargs = dict(max_new_tokens=8, stopping_criteria=StoppingCriteriaList([StopOnResidue(4)]))
    examples = [decoder.prepare(q, d, 8, document_paths=True) for q, d in zip(QUESTIONS, DOCUMENTS)]
    # ctx, no-context, documents, head set a (two lanes), head set b: each row's prompt once
    rows = sum(3 * len(e.context_ids) + len(e.no_context_ids) + sum(map(len, e.document_ids)) for e in examples)
    counter = ForwardCounter(ModelAnatomy.of(decoder.model).backbone)
    try:
        together = decoder.generate_batch(QUESTIONS, DOCUMENTS, methods=methods, **kwargs)
    finally:
        counter.handle.remove()
    prefill, decode = counter.split()
    assert set(prefill) == {1} and decoder.stats.prompt_tokens == rows
    lengths = [len(r.token_ids) for results in together.values() for r in results]
    assert len(set(lengths)) > 1 and min(lengths) < 8  # some rows finished early and were pruned
    assert len(set(decode)) > 1
    for label, method in methods.items():
        alone = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=method, **kwargs)
        for a, b in zip(together[label], alone):
            assert a.token_ids == b.token_ids, label
            assert a.alphas == pytest.approx(b.alphas, abs=1e-5)


def test_stream_with_extra_paths_equals_generate(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    for method in ("dvd", HeadProbe(HEADS)):
        stream = decoder.stream(QUESTIONS[2], DOCUMENTS[2], method=method, max_new_tokens=8, stop=[])
        text = "".join(stream)
        full = decoder.generate(QUESTIONS[2], DOCUMENTS[2], method=method, max_new_tokens=8, stop=[])
        assert text == stream.result.text == full.text
        assert stream.result.token_ids == full.token_ids


# -- bad input ---------------------------------------------------------------------------------------


def test_too_few_documents_are_refused_before_decoding(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    counter = ForwardCounter(ModelAnatomy.of(decoder.model).backbone)
    try:
        with pytest.raises(ValueError, match="method 'dvd' .*at least 2 documents per question, but example 0 has 1"):
            decoder.generate("Q?", ["one document"], method="dvd")
        with pytest.raises(ValueError, match="method 'dvd' .*but example 1 has 1"):
            decoder.generate_batch(["Q?", "R?"], [["a", "b"], ["c"]], methods=["cad", "dvd"])
        with pytest.raises(ValueError, match="method 'dvd' .*at least 2 documents"):
            decoder.stream("Q?", ["one document"], method="dvd")  # at the call, not at the first delta
    finally:
        counter.handle.remove()
    assert counter.calls == []
    fallback = decoder.generate("Q?", [], method="dvd", max_new_tokens=2)  # no documents at all: like every method
    assert fallback.method == "standard" and fallback.requested_method == "dvd"


def test_raw_prompts_cannot_run_document_paths(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    with pytest.raises(ValueError, match="method 'dvd' runs one path per document, which raw prompts cannot provide"):
        decoder.generate(PromptPair("Doc. Q? A:", "Q? A:"), method="dvd")
    with pytest.raises(ValueError, match="method 'dvd' runs one path per document, which raw prompts cannot provide"):
        decoder.stream(PromptPair("Doc. Q? A:", "Q? A:"), method=DvdRule())
    raw = decoder.prompts.prepare_from_prompts("Doc. Q? A:", "Q? A:", 4)
    with pytest.raises(ValueError, match="example 0 has no per-document prompts"):
        decoder.generate_batch([raw], method=DvdRule(), max_new_tokens=4)
    plain = decoder.prepare("Q?", ["a", "b"], 4)  # prepared without document_paths
    with pytest.raises(ValueError, match="document_paths=True"):
        decoder.generate_batch([plain], method=DvdRule(), max_new_tokens=4)


@pytest.mark.parametrize(
    "heads, message",
    [
        ({0: (1,)}, "layer 0 is not a block of this 4-layer model"),
        ({5: (0,)}, "layer 5 is not a block"),
        ({True: (0,)}, "layer True is not a block"),
        ({1: (4,)}, r"heads \[4\] of layer 1 are not heads of this model .*0\.\.3"),
        ({2: (0, -1)}, r"heads \[-1\] of layer 2"),
        ({2: ("0",)}, r"heads \['0'\] of layer 2"),
        ({2: 1}, "the heads of layer 2 must be a list"),
        ([(1, (0,))], "must be a mapping"),
    ],
)
def test_bad_heads_are_refused_before_decoding(tiny_llama, tokenizer, heads, message):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    counter = ForwardCounter(ModelAnatomy.of(decoder.model).backbone)
    try:
        with pytest.raises(ValueError, match=f"method 'head-probe'.*{message}"):
            decoder.generate(QUESTIONS[0], DOCUMENTS[0], method=HeadProbe(heads))
    finally:
        counter.handle.remove()
    assert counter.calls == []


def test_heads_on_a_model_without_o_proj_are_refused(tokenizer):
    model = build_tiny_model("llama", len(tokenizer))
    model.model.layers[2].self_attn.o_proj = torch.nn.Identity()
    decoder = FidesDecoder(model, tokenizer)
    with pytest.raises(UnsupportedArchitectureError, match="block 3 has no self_attn.o_proj"):
        decoder.generate(QUESTIONS[0], DOCUMENTS[0], method=HeadProbe(HEADS))
    assert ModelAnatomy.of(model).num_heads == 4
