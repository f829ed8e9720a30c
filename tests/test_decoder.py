"""The dual-path decoder on tiny random-weight models: exactness against transformers and a naive
reference loop, batching, generation controls, prompts and bad input."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch
from transformers import LogitsProcessorList, MaxLengthCriteria, RepetitionPenaltyLogitsProcessor, StoppingCriteriaList

from fides_rag import FidesConfig, FidesDecoder, NonFiniteLogitsError, PromptPair, PromptTemplate, get_method
from fides_rag.method.lens import ModelAnatomy
from fides_rag.testing import build_tiny_model

QUESTIONS = [
    "What is the capital of France?",
    "Who chose Canberra?",
    "What is the capital of Australia and why was it chosen as a compromise between two cities?",
    "What jumps?",
]
DOCUMENTS = [
    ["Lyon is the capital of France."],
    ["The capital of Australia is Melbourne.", "Canberra was chosen as a compromise."],
    ["Paris is a large city on the Seine. " * 3],
    ["The quick brown fox jumps over the lazy dog."],
]
PROMPT_PAIRS = [
    (
        "Document: Lyon is the capital of France. Question: What is the capital of France? Answer:",
        "Question: What is the capital of France? Answer:",
    ),
    ("The capital of Australia is Melbourne. Canberra was chosen as a compromise. " * 3 + "Answer:", "Answer:"),
]


def decoder_for(model, tokenizer, **kwargs) -> FidesDecoder:
    return FidesDecoder(model, tokenizer, **kwargs)


# -- exactness ---------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3"])
def test_standard_matches_transformers_generate(tiny_models, tokenizer, family):
    model = tiny_models[family]
    decoder = decoder_for(model, tokenizer)
    for context_prompt, _ in PROMPT_PAIRS:
        ids = tokenizer(context_prompt, return_tensors="pt")
        expected = model.generate(**ids, do_sample=False, max_new_tokens=12, pad_token_id=0)[
            0, ids["input_ids"].shape[1] :
        ]
        result = decoder.generate(PromptPair(context_prompt, "unused"), method="standard", max_new_tokens=12)
        assert result.token_ids == expected.tolist()
        assert result.no_context_prompt is None
        assert all(
            s.alpha is None and s.opposition is None and s.shift is None and s.noise is None for s in result.steps
        )


DEFAULT_CONFIG = FidesConfig()


def naive_reference(model, ctx_ids, no_ctx_ids, method, steps, eos_ids, config=DEFAULT_CONFIG):
    """Recompute both full sequences at every step, one path at a time, no cache; signals in float64."""
    num_layers = model.config.num_hidden_layers
    softcap = getattr(model.config, "final_logit_softcapping", None)
    model.config.tie_last_hidden_states = False  # hidden_states[L] = raw output of block L
    ctx, no_ctx = list(ctx_ids), list(no_ctx_ids)
    tokens, alphas = [], []
    try:
        for _ in range(steps):
            with torch.no_grad():
                out_c = model(torch.tensor([ctx]), output_hidden_states=True)
                out_n = model(torch.tensor([no_ctx]), output_hidden_states=True)
            z_c, z_n = out_c.logits[0, -1].double(), out_n.logits[0, -1].double()
            p, q = torch.softmax(z_c, -1), torch.softmax(z_n, -1)
            m = (p + q) / 2
            jsd = 0.5 * (p * (p / m).log()).sum() + 0.5 * (q * (q / m).log()).sum()
            if method == "cad":
                alpha = 1.0
            elif method == "adacad":
                alpha = jsd.item()
            else:
                dist = 0.0
                for layer in range(1, num_layers + 1):
                    hc = out_c.hidden_states[layer][0, -1].double()
                    hn = out_n.hidden_states[layer][0, -1].double()
                    dist += (hc / hc.norm() - hn / hn.norm()).norm().item()
                shift = min(1.0, dist / (config.shift_scale * num_layers))
                mid = math.floor(config.noise_layer_ratio * num_layers)
                with torch.no_grad():
                    lens = model.lm_head(model.model.norm(out_c.hidden_states[mid][:, -1]))[0].double()
                if softcap:
                    lens = torch.tanh(lens / softcap) * softcap
                lp = torch.softmax(lens, -1)
                noise = min(1.0, (lp * (lp / p).log()).sum().item() / config.noise_scale)
                score = sum(w * s for w, s in zip(config.weights, (jsd.item(), shift, noise)))
                alpha = max(config.alpha_min, config.lambda_ * score)
            final = (1 + alpha) * z_c - alpha * z_n
            token = int(final.argmax())
            tokens.append(token)
            alphas.append(alpha)
            if token in eos_ids:
                break
            ctx.append(token)
            no_ctx.append(token)
    finally:
        del model.config.tie_last_hidden_states
    return tokens, alphas


def test_hidden_states_reference_is_block_output(tiny_llama):
    """The naive reference reads hidden_states[L] with tie_last_hidden_states off: the raw block output."""
    anatomy = ModelAnatomy.of(tiny_llama)
    seen = {}
    handle = anatomy.layers[-1].register_forward_hook(lambda m, i, o: seen.__setitem__("h", o))
    tiny_llama.config.tie_last_hidden_states = False
    try:
        with torch.no_grad():
            out = tiny_llama(torch.tensor([[5, 6, 7]]), output_hidden_states=True)
    finally:
        del tiny_llama.config.tie_last_hidden_states
        handle.remove()
    assert len(out.hidden_states) == anatomy.num_layers + 1
    torch.testing.assert_close(out.hidden_states[-1], seen["h"])


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gemma2", "qwen2"])
@pytest.mark.parametrize("method", ["cad", "adacad", "fides"])
def test_cached_batched_decoder_equals_naive_loop(tiny_models, tokenizer, family, method):
    model = tiny_models[family]
    decoder = decoder_for(model, tokenizer)
    for context_prompt, no_context_prompt in PROMPT_PAIRS:
        result = decoder.generate(PromptPair(context_prompt, no_context_prompt), method=method, max_new_tokens=10)
        ctx_ids, no_ids = tokenizer(context_prompt)["input_ids"], tokenizer(no_context_prompt)["input_ids"]
        tokens, alphas = naive_reference(model, ctx_ids, no_ids, method, 10, decoder.eos_token_ids)
        assert result.token_ids == tokens
        assert result.alphas == pytest.approx(alphas, abs=1e-4)


@pytest.mark.parametrize("method", ["standard", "cad", "adacad", "fides"])
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_batch_equals_single(tiny_models, tokenizer, method, family):
    decoder = decoder_for(tiny_models[family], tokenizer)
    batch = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=method, max_new_tokens=8, stop=[])
    assert len({len(decoder.prepare(q, d, 8).context_ids) for q, d in zip(QUESTIONS, DOCUMENTS)}) == 4
    for question, docs, batched in zip(QUESTIONS, DOCUMENTS, batch):
        single = decoder.generate(question, docs, method=method, max_new_tokens=8)
        assert batched.token_ids == single.token_ids
        assert batched.text == single.text
        for a, b in zip(batched.steps, single.steps):
            for field in ("alpha", "opposition", "shift", "noise", "score"):
                x, y = getattr(a, field), getattr(b, field)
                assert (x is None) == (y is None)
                if x is not None:
                    assert x == pytest.approx(y, abs=1e-4)


def test_cad_alpha_zero_equals_standard(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer)
    for question, docs in zip(QUESTIONS, DOCUMENTS):
        standard = decoder.generate(question, docs, method="standard", max_new_tokens=10)
        cad0 = decoder.generate(question, docs, method=get_method("cad", alpha=0.0), max_new_tokens=10)
        assert cad0.token_ids == standard.token_ids


class ForwardCounter:
    """Records (rows, width) of every backbone forward."""

    def __init__(self, module):
        self.calls: list[tuple[int, int]] = []
        self.handle = module.register_forward_hook(lambda m, args, kwargs, out: self.record(kwargs), with_kwargs=True)

    def record(self, kwargs):
        self.calls.append(tuple(kwargs["input_ids"].shape))

    @property
    def batch_sizes(self) -> list[int]:
        return [rows for rows, _ in self.calls]


@pytest.mark.parametrize("split_prefill", [True, False])
@pytest.mark.parametrize("method, paths", [("standard", 1), ("cad", 2), ("fides", 2)])
def test_one_forward_per_step_with_all_paths(tiny_llama, tokenizer, method, paths, split_prefill):
    """A budget that holds every prompt: the three requests are prefilled in the first step and decode together."""
    decoder = decoder_for(tiny_llama, tokenizer, split_prefill=split_prefill, max_num_batched_tokens=8192)
    counter = ForwardCounter(ModelAnatomy.of(decoder.model).backbone)
    try:
        results = decoder.generate_batch(QUESTIONS[:3], DOCUMENTS[:3], method=method, max_new_tokens=6, stop=[])
    finally:
        counter.handle.remove()
    assert all(len(r.token_ids) == 6 for r in results)  # nobody finished early, so no row was pruned
    prefill = [call for call in counter.calls if call[1] > 1]
    decode = [call for call in counter.calls if call[1] == 1]
    if split_prefill:
        assert {rows for rows, _ in prefill} == {1}  # each prompt row in its own forwards (cut at its anchors)
        assert sum(tokens for _, tokens in prefill) <= decoder.stats.prompt_tokens
    elif paths == 1:
        assert [rows for rows, _ in prefill] == [3]
    else:
        assert [rows for rows, _ in prefill] == [3 * paths]
    assert [rows for rows, _ in decode] == [3 * paths] * 5  # every later step: one forward, all paths, all examples


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3_text", "qwen3"])
def test_split_prefill_equals_joint_prefill(tiny_models, tokenizer, family):
    """gemma2/gemma3 have a 16-token sliding window here, shorter than the prompts: their caches merge too."""
    split = decoder_for(tiny_models[family], tokenizer, split_prefill=True)
    joint = decoder_for(tiny_models[family], tokenizer, split_prefill=False)
    for method in ("cad", "fides"):
        a = split.generate_batch(QUESTIONS, DOCUMENTS, method=method, max_new_tokens=8, stop=[])
        b = joint.generate_batch(QUESTIONS, DOCUMENTS, method=method, max_new_tokens=8, stop=[])
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids
            assert x.alphas == pytest.approx(y.alphas, abs=1e-4)
            assert [s.shift for s in x.steps] == pytest.approx([s.shift for s in y.steps], abs=1e-4)
            assert [s.noise for s in x.steps] == pytest.approx([s.noise for s in y.steps], abs=1e-4)


# -- generation controls -----------------------------------------------------------------------


def test_multi_token_stop_string_is_cut(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer)
    prompt = PROMPT_PAIRS[0]
    free = decoder.generate(PromptPair(*prompt), method="fides", max_new_tokens=12)
    pieces = [tokenizer.decode([t]) for t in free.token_ids]
    full = tokenizer.decode(free.token_ids)
    # A stop string spanning the boundary of tokens 3 and 4 (and longer than one token).
    stop = (pieces[2] + pieces[3] + pieces[4])[1:]
    start = full.find(stop)
    assert start >= 0
    stopped = decoder.generate(PromptPair(*prompt), method="fides", max_new_tokens=12, stop=[stop])
    assert stopped.finish_reason == "stop"
    assert stopped.text == full[:start].strip()
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]
    assert len(stopped.token_ids) == 5


def test_every_declared_eos_id_stops(tokenizer):
    model = build_tiny_model("llama", len(tokenizer))
    decoder = decoder_for(model, tokenizer)
    free = decoder.generate(PromptPair(*PROMPT_PAIRS[0]), method="cad", max_new_tokens=10)
    third = free.token_ids[2]
    model.generation_config.eos_token_id = [1, third]
    decoder = decoder_for(model, tokenizer)
    assert {1, third} <= decoder.eos_token_ids
    ended = decoder.generate(PromptPair(*PROMPT_PAIRS[0]), method="cad", max_new_tokens=10)
    first_hit = free.token_ids.index(third)
    assert ended.finish_reason == "eos"
    assert ended.token_ids == free.token_ids[: first_hit + 1]


def test_max_new_tokens_and_length_reason(tiny_llama, tokenizer):
    result = decoder_for(tiny_llama, tokenizer).generate(PromptPair(*PROMPT_PAIRS[1]), max_new_tokens=3)
    assert len(result.token_ids) <= 3
    if result.finish_reason == "length":
        assert len(result.token_ids) == 3


@pytest.mark.parametrize("method", ["standard", "fides"])
def test_stream_deltas_concatenate_to_final_text(tiny_llama, tokenizer, method):
    decoder = decoder_for(tiny_llama, tokenizer)
    for question, docs in zip(QUESTIONS, DOCUMENTS):
        stream = decoder.stream(question, docs, method=method, max_new_tokens=12, stop=[])
        deltas = list(stream)
        full = decoder.generate(question, docs, method=method, max_new_tokens=12, stop=[])
        assert "".join(deltas) == stream.result.text == full.text
        assert stream.result.token_ids == full.token_ids


def test_stream_holds_back_a_partial_stop_string(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer)
    free = decoder.generate(PromptPair(*PROMPT_PAIRS[0]), max_new_tokens=12)
    full = tokenizer.decode(free.token_ids)
    stop = full[len(full) // 2 : len(full) // 2 + 4]
    stream = decoder.stream(PromptPair(*PROMPT_PAIRS[0]), max_new_tokens=12, stop=[stop])
    joined = "".join(stream)
    assert stop not in joined
    assert joined == stream.result.text


def test_sampling_is_reproducible_with_a_seed(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer)
    kwargs = dict(method="fides", max_new_tokens=10, do_sample=True, temperature=1.5, top_p=0.95, top_k=50)
    a = decoder.generate(PromptPair(*PROMPT_PAIRS[0]), seed=7, **kwargs)
    b = decoder.generate(PromptPair(*PROMPT_PAIRS[0]), seed=7, **kwargs)
    others = {tuple(decoder.generate(PromptPair(*PROMPT_PAIRS[0]), seed=s, **kwargs).token_ids) for s in range(8, 14)}
    assert a.token_ids == b.token_ids
    assert len(others | {tuple(a.token_ids)}) > 1


def test_user_logits_processor_and_stopping_criteria(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer)
    prompt_len = len(tokenizer(PROMPT_PAIRS[0][0])["input_ids"])
    result = decoder.generate(
        PromptPair(*PROMPT_PAIRS[0]),
        max_new_tokens=10,
        logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1e6)]),
        stopping_criteria=StoppingCriteriaList([MaxLengthCriteria(max_length=prompt_len + 4)]),
    )
    assert result.finish_reason in ("criteria", "eos")
    assert len(result.token_ids) <= 4
    assert len(set(result.token_ids)) == len(result.token_ids)


# -- prompts -----------------------------------------------------------------------------------


def test_default_template_two_shot_and_branch_difference(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer)
    result = decoder.generate("What is the capital of France?", ["Lyon is the capital of France."], max_new_tokens=2)
    ctx, no_ctx = result.context_prompt, result.no_context_prompt
    assert ctx.count("Using only the references listed above, answer the following question:") == 3
    assert no_ctx.count("Answer the following question:") == 3 and "Document [" not in no_ctx
    assert "Document [1]: Lyon is the capital of France." in ctx
    assert ctx.endswith("Question: What is the capital of France?\nAnswer:")


def test_chat_template_on_both_branches(tiny_llama, chat_tokenizer):
    decoder = decoder_for(tiny_llama, chat_tokenizer)
    assert decoder.prompts.use_chat_template
    result = decoder.generate(
        "What is the capital of France?", ["Lyon is the capital of France."], method="cad", max_new_tokens=2
    )
    for prompt in (result.context_prompt, result.no_context_prompt):
        assert prompt.startswith("<bos><|user|>") and prompt.endswith("<|assistant|>\n")
        assert prompt.count("<|assistant|>") == 3
    ids = chat_tokenizer(result.context_prompt, add_special_tokens=False)["input_ids"]
    assert ids.count(chat_tokenizer.bos_token_id) == 1
    plain = decoder_for(tiny_llama, chat_tokenizer, use_chat_template=False)
    assert not plain.generate("Q?", ["doc"], max_new_tokens=1).context_prompt.startswith("<bos><|user|>")


def test_custom_template_and_document_objects(tiny_llama, tokenizer):
    template = PromptTemplate(
        context_instruction="Answer from the passages:",
        no_context_instruction="Answer:",
        demonstrations=(),
        document_format="<{index}> {text}",
    )
    decoder = decoder_for(tiny_llama, tokenizer, prompt_template=template)
    docs = [SimpleNamespace(page_content="Lyon is the capital."), SimpleNamespace(text="Paris is a city."), "A string."]
    result = decoder.generate("Which city?", docs, max_new_tokens=2)
    assert result.context_prompt.startswith(
        "<1> Lyon is the capital.\n<2> Paris is a city.\n<3> A string.\nAnswer from the passages:"
    )
    assert result.no_context_prompt.startswith("Answer:\nQuestion: Which city?")
    with pytest.raises(TypeError, match="unsupported document type int"):
        decoder.generate("Which city?", [42])


# -- bad input ---------------------------------------------------------------------------------


def test_bad_input_gets_clear_errors(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer)
    with pytest.raises(ValueError, match="question must be a non-empty string"):
        decoder.generate("   ", ["doc"])
    with pytest.raises(ValueError, match="unknown method 'fidez'"):
        decoder.generate("Q?", ["doc"], method="fidez")
    with pytest.raises(ValueError, match="unknown method"):
        FidesDecoder(tiny_llama, tokenizer, method="nope")
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        decoder.generate("Q?", ["doc"], max_new_tokens=0)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        FidesDecoder(tiny_llama, tokenizer, max_new_tokens=-3)
    with pytest.raises(ValueError, match="FidesConfig.lambda_"):
        FidesDecoder(tiny_llama, tokenizer, config=FidesConfig(lambda_=-1))
    with pytest.raises(ValueError, match="2 questions but 1 document lists"):
        decoder.generate_batch(["a?", "b?"], [["doc"]])
    with pytest.raises(ValueError, match="top_p must lie in"):
        decoder.generate("Q?", ["doc"], do_sample=True, top_p=0)


def test_no_documents_falls_back_to_standard_and_says_so(tiny_llama, tokenizer, caplog):
    decoder = decoder_for(tiny_llama, tokenizer)
    counter = ForwardCounter(ModelAnatomy.of(decoder.model).backbone)
    with caplog.at_level(logging.WARNING, logger="fides_rag"):
        try:
            result = decoder.generate("What is the capital of France?", [], method="fides", max_new_tokens=3)
        finally:
            counter.handle.remove()
    assert result.method == "standard" and result.requested_method == "fides"
    assert result.notes and "no documents" in result.notes[0]
    assert "no documents" in caplog.text
    assert set(counter.batch_sizes) == {1}  # standard on the question alone: no second path
    assert "Document [" not in result.context_prompt
    mixed = decoder.generate_batch(
        ["Q one?", "Q two?"], [None, ["Lyon is the capital of France."]], method="cad", max_new_tokens=3
    )
    assert [r.method for r in mixed] == ["standard", "cad"]


def test_documents_longer_than_the_window_are_trimmed(tokenizer, caplog):
    model = build_tiny_model("llama", len(tokenizer), max_position_embeddings=400)
    decoder = decoder_for(model, tokenizer)
    long_doc = "The capital of Australia is Melbourne. " * 200
    with caplog.at_level(logging.WARNING, logger="fides_rag"):
        result = decoder.generate("What is the capital?", [long_doc], method="fides", max_new_tokens=20)
    assert result.documents_trimmed
    given, kept = result.document_tokens
    assert kept < given
    assert result.prompt_tokens + 20 <= 400
    assert "trimmed" in result.notes[0] and "trimmed" in caplog.text
    with pytest.raises(ValueError, match="exceeds the context window"):
        decoder.generate(PromptPair(long_doc, "Q"), max_new_tokens=5)
    with pytest.raises(ValueError, match="the question alone"):
        decoder.generate("word " * 500 + "?", ["doc"], max_new_tokens=5)


def test_nan_logits_raise_a_clear_error(tokenizer):
    model = build_tiny_model("llama", len(tokenizer))
    with torch.no_grad():
        model.lm_head.weight[5, 0] = float("nan")
    decoder = decoder_for(model, tokenizer)
    with pytest.raises(NonFiniteLogitsError, match="NaN or inf logits at generation step 0"):
        decoder.generate("Q?", ["doc"], max_new_tokens=3)


# -- several methods over one shared prefill ------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_methods_option_equals_each_method_alone(tiny_models, tokenizer, family):
    decoder = decoder_for(tiny_models[family], tokenizer)
    methods = {
        "standard": "standard",
        "cad": "cad",
        "adacad": "adacad",
        "fides": "fides",
        "fides-no-noise": get_method("fides", config=FidesConfig().without("noise")),
        "fixed": get_method("fides", fixed_alpha=1.0),
    }
    together = decoder.generate_batch(QUESTIONS, DOCUMENTS, methods=methods, max_new_tokens=8, stop=[])
    assert list(together) == list(methods)
    for label, method in methods.items():
        alone = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=method, max_new_tokens=8, stop=[])
        for a, b in zip(together[label], alone):
            assert a.token_ids == b.token_ids
            assert a.alphas == pytest.approx(b.alphas, abs=1e-4)
            assert a.method == b.method


def test_methods_on_prompt_pairs_equal_each_alone(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer)
    pairs = [(f"Context: {docs[0]}\nQ: {q}\nA:", f"Q: {q}\nA:") for q, docs in zip(QUESTIONS, DOCUMENTS)]
    together = decoder.generate_batch(
        [PromptPair(ctx, noctx) for ctx, noctx in pairs], methods=["standard", "cad", "fides"], max_new_tokens=6
    )
    for label in ("standard", "cad", "fides"):
        alone = [decoder.generate(PromptPair(ctx, noctx), method=label, max_new_tokens=6) for ctx, noctx in pairs]
        assert [r.token_ids for r in together[label]] == [r.token_ids for r in alone]
        assert [r.alphas for r in together[label]] == [pytest.approx(r.alphas, abs=1e-4) for r in alone]


def test_methods_prefill_once_and_prune_finished_rows(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer, max_num_batched_tokens=8192)  # both requests join at the first step
    counter = ForwardCounter(ModelAnatomy.of(decoder.model).backbone)
    try:
        results = decoder.generate_batch(
            QUESTIONS[:2], DOCUMENTS[:2], methods=["standard", "cad", "fides"], max_new_tokens=6, stop=[]
        )
    finally:
        counter.handle.remove()
    prefill = [rows for rows, width in counter.calls if width > 1]
    decode = [rows for rows, width in counter.calls if width == 1]
    assert set(prefill) == {1}  # each prompt row in its own forwards
    prompts = [decoder.prepare(q, d, 6) for q, d in zip(QUESTIONS[:2], DOCUMENTS[:2])]
    assert decoder.stats.prompt_tokens == sum(
        len(p.context_ids) + len(p.no_context_ids) for p in prompts
    )  # once, for 3 methods
    if decode:
        still_running = sum(
            (len(r.token_ids) > 1) * (1 if m == "standard" else 2) for m, rs in results.items() for r in rs
        )
        assert decode[0] == still_running  # 2 + 4 + 4 rows when nobody finished at step 0
    with pytest.raises(ValueError, match="repeat a name"):
        decoder.generate_batch(["Q?"], [["d"]], methods=["cad", get_method("cad", alpha=0.5)])


def test_methods_without_documents_report_standard_under_each_label(tiny_llama, tokenizer):
    decoder = decoder_for(tiny_llama, tokenizer)
    results = decoder.generate_batch(
        ["Q one?", "Q two?"], [None, ["Lyon."]], methods=["cad", "fides"], max_new_tokens=3
    )
    assert [r.method for r in results["cad"]] == ["standard", "cad"]
    assert [r.requested_method for r in results["fides"]] == ["fides", "fides"]
    assert results["cad"][0].token_ids == results["fides"][0].token_ids


def test_raw_prompts_can_skip_special_tokens(tiny_llama, chat_tokenizer):
    decoder = decoder_for(tiny_llama, chat_tokenizer)
    text = chat_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    example = decoder.prompts.prepare_from_prompts(text, text, 4, add_special_tokens=False)
    assert example.context_ids.count(chat_tokenizer.bos_token_id) == 1
    result = decoder.generate(PromptPair(text, text, add_special_tokens=False), method="standard", max_new_tokens=2)
    assert result.prompt_tokens == len(example.context_ids)


def test_single_path_rule_gets_logit_lens_rows(tiny_llama, tokenizer):
    """A single-path rule (DoLa-style) may ask for lens logits; at the last layer they are the model's logits."""
    from fides_rag import ContrastRule
    from fides_rag.rules import StepOutput

    seen = []

    class LensProbe(ContrastRule):
        name = "lens-probe"
        paths = ("context",)

        def lens_layers(self, num_layers):
            return (1, num_layers)

        def combine(self, step):
            seen.append((step.ctx_logits, step.lens_logits))
            return StepOutput(logits=step.ctx_logits)

    decoder = decoder_for(tiny_llama, tokenizer)
    probe = decoder.generate(PromptPair(*PROMPT_PAIRS[0]), method=LensProbe(), max_new_tokens=3)
    standard = decoder.generate(PromptPair(*PROMPT_PAIRS[0]), method="standard", max_new_tokens=3)
    assert probe.token_ids == standard.token_ids
    for ctx_logits, lens in seen:
        assert set(lens) == {1, 4}
        torch.testing.assert_close(lens[4], ctx_logits, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(lens[1], ctx_logits)
