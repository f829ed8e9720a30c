"""Unit tests of FidesLLM on tiny random-weight models: context extraction, kwargs, streaming, async, errors."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from llama_index.core import Document, MockEmbedding, VectorStoreIndex
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import ValidationError
from llama_index.core.chat_engine.context import DEFAULT_CONTEXT_TEMPLATE
from llama_index.core.prompts import PromptTemplate
from llama_index.core.prompts.default_prompt_selectors import (
    DEFAULT_REFINE_PROMPT_SEL,
    DEFAULT_TEXT_QA_PROMPT_SEL,
    DEFAULT_TREE_SUMMARIZE_PROMPT_SEL,
)
from llama_index.llms.fides import FidesLLM

from fides_rag import FidesDecoder
from fides_rag.method.lens import ModelAnatomy

DOC = "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."
QUERY = "In which city is the Eiffel Tower located?"


@pytest.fixture()
def llm(chat_decoder):
    return FidesLLM.from_decoder(chat_decoder, max_new_tokens=4)


@pytest.fixture()
def plain_llm(plain_decoder):
    return FidesLLM.from_decoder(plain_decoder, max_new_tokens=4)


def last_info(llm):
    return llm.history[-1]["info"]


# -- construction and metadata ---------------------------------------------------------------------


def test_metadata_reports_the_decoders_window_and_budget(llm, plain_llm, chat_decoder):
    meta = llm.metadata
    assert meta.context_window == chat_decoder.limits.context_window == 1024
    assert meta.num_output == 4
    assert meta.is_chat_model is True
    assert plain_llm.metadata.is_chat_model is False
    assert FidesLLM.from_decoder(chat_decoder, model_name="tiny").metadata.model_name == "tiny"


def test_constructors_share_one_decoder(chat_decoder):
    a = FidesLLM.from_decoder(chat_decoder, method="fides")
    b = FidesLLM(chat_decoder, method="cad")
    c = FidesLLM(model=chat_decoder.model, tokenizer=chat_decoder.tokenizer, max_new_tokens=3)
    assert a.decoder is b.decoder is chat_decoder
    assert c.decoder.model is chat_decoder.model and c.max_new_tokens == 3
    assert a.max_new_tokens == chat_decoder.max_new_tokens  # the decoder's budget by default


def test_constructor_errors(chat_decoder):
    with pytest.raises(TypeError, match="FidesDecoder"):
        FidesLLM()
    with pytest.raises(TypeError, match="FidesDecoder"):
        FidesLLM("gemma3-270m")
    with pytest.raises(ValidationError, match="unknown method"):
        FidesLLM(chat_decoder, method="nope")
    with pytest.raises(ValueError, match="lambda_"):
        FidesLLM(chat_decoder, lambda_=-1.0)
    with pytest.raises(ValueError, match="noise_layer_ratio|weights"):
        FidesLLM(chat_decoder, weights=(0.0, 0.0, 0.0))


def test_fides_config_reaches_the_rule(llm):
    fixed = llm.model_copy(update={"fides_config": llm.effective_fides_config.with_fixed_alpha(0.7)})
    r = fixed.complete(QUERY, documents=[DOC])
    assert r.additional_kwargs["alphas"] == pytest.approx([0.7] * len(r.additional_kwargs["alphas"]))


# -- predict: context extraction per prompt type -----------------------------------------------------


def test_text_qa_context_path_and_no_context_path(llm):
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str=QUERY)
    out = llm.predict(qa, context_str=DOC)
    info = last_info(llm)
    assert isinstance(out, str)
    assert info["prompt_type"] == "text_qa" and info["method"] == "fides"
    assert DOC in info["context_prompt"] and DOC not in info["no_context_prompt"]
    assert QUERY in info["context_prompt"] and QUERY in info["no_context_prompt"]
    assert info["context_prompt"].endswith("<|assistant|>\n")  # the tokenizer's chat template
    assert len(info["alphas"]) >= 1 and all(a is not None for a in info["alphas"])


def test_refine_keeps_the_existing_answer_in_both_paths(llm):
    refine = DEFAULT_REFINE_PROMPT_SEL.partial_format(query_str=QUERY, existing_answer="Paris, France")
    llm.predict(refine, context_msg=DOC)
    info = last_info(llm)
    assert info["prompt_type"] == "refine" and info["context_variables"] == ["context_msg"]
    assert "Paris, France" in info["context_prompt"] and "Paris, France" in info["no_context_prompt"]
    assert DOC in info["context_prompt"] and DOC not in info["no_context_prompt"]


def test_simple_summarize_list_context_is_joined(llm):
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str=QUERY)
    llm.predict(qa, context_str=[DOC, "Second chunk."])
    info = last_info(llm)
    assert f"{DOC}\n\nSecond chunk." in info["context_prompt"]
    assert "['" not in info["context_prompt"]


def test_tree_summarize_stage_is_reported(llm):
    summary = DEFAULT_TREE_SUMMARIZE_PROMPT_SEL.partial_format(query_str=QUERY)
    llm.predict(summary, context_str="Summary: the tower stands in Rome.")
    info = last_info(llm)
    assert info["prompt_type"] == "summary"
    assert "stands in Rome" in info["context_prompt"] and "stands in Rome" not in info["no_context_prompt"]


def test_prompt_without_context_decodes_standard(llm):
    llm.predict(PromptTemplate("Tell me about {topic}."), topic="towers")
    info = last_info(llm)
    assert info["method"] == "standard" and info["requested_method"] == "fides"
    assert info["no_context_prompt"] is None
    assert (
        info["notes"][0]
        == "the context variable (context_str, context_msg) is not in the prompt: decoded with 'standard'"
    )


def test_plain_tokenizer_uses_llamaindex_text_prompt(plain_llm):
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str=QUERY)
    plain_llm.predict(qa, context_str=DOC)
    info = last_info(plain_llm)
    expected = qa.format(llm=plain_llm, context_str=DOC)
    assert info["context_prompt"] == expected
    assert info["no_context_prompt"] == qa.format(llm=plain_llm, context_str="")


def test_custom_completion_to_prompt_is_respected(chat_decoder):
    llm = FidesLLM.from_decoder(chat_decoder, max_new_tokens=2, completion_to_prompt=lambda p: f"[INST]{p}[/INST]")
    assert llm.metadata.is_chat_model is False
    llm.complete("hello")
    assert last_info(llm)["context_prompt"] == "[INST]hello[/INST]"


# -- per-call options ------------------------------------------------------------------------------


def test_per_call_options_in_predict_and_complete(llm):
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str=QUERY)
    llm.predict(qa, context_str=DOC, method="cad", max_new_tokens=2)
    info = last_info(llm)
    assert info["method"] == "cad" and len(info["steps"]) <= 2
    r = llm.complete(QUERY, documents=[DOC], method="standard", max_new_tokens=3)
    assert r.additional_kwargs["method"] == "standard" and len(r.raw["token_ids"]) <= 3
    sampled = [llm.complete(QUERY, documents=[DOC], do_sample=True, seed=3, temperature=0.8).text for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_unknown_kwargs_are_rejected_not_ignored(llm):
    with pytest.raises(TypeError, match="unsupported keyword"):
        llm.complete("hi", beam_width=4)
    with pytest.raises(TypeError, match="unsupported keyword"):
        llm.chat([ChatMessage(role="user", content="hi")], frequency_penalty=1.0)


def test_explicit_no_context_prompt(llm):
    r = llm.complete("CTX prompt", formatted=True, no_context_prompt="NOCTX prompt")
    info = r.additional_kwargs
    assert (
        info["context_prompt"] == "CTX prompt"
        and info["no_context_prompt"] == "NOCTX prompt"
        and info["method"] == "fides"
    )


# -- plain calls ------------------------------------------------------------------------------------


def test_complete_without_documents_is_standard_and_with_documents_contrastive(llm):
    r = llm.complete(QUERY)
    assert r.additional_kwargs["method"] == "standard"
    r = llm.complete(QUERY, documents=[Document(text=DOC)])
    assert r.additional_kwargs["method"] == "fides"
    assert DOC in r.additional_kwargs["context_prompt"] and DOC not in r.additional_kwargs["no_context_prompt"]
    assert r.raw["requested_method"] == "fides" and r.text == llm.last_result.text


def test_chat_with_documents_and_with_rendered_context_message(llm):
    msgs = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content=QUERY)]
    r = llm.chat(msgs, documents=[DOC])
    info = r.additional_kwargs
    assert r.message.role == MessageRole.ASSISTANT and info["method"] == "fides"
    assert DOC in info["context_prompt"] and DOC not in info["no_context_prompt"]
    assert "Be brief." in info["context_prompt"] and "Be brief." in info["no_context_prompt"]
    rendered = [ChatMessage(role="system", content=DEFAULT_CONTEXT_TEMPLATE.format(context_str=DOC)), msgs[1]]
    info = llm.chat(rendered).additional_kwargs
    assert info["method"] == "fides" and DOC not in info["no_context_prompt"]
    assert llm.chat([msgs[1]]).additional_kwargs["method"] == "standard"


def test_chat_errors(llm):
    with pytest.raises(ValueError, match="no user message"):
        llm.chat([ChatMessage(role="system", content="You are helpful.")])
    with pytest.raises(ValueError, match="no user message"):
        list(llm.stream_chat([ChatMessage(role="assistant", content="Hi")]))
    with pytest.raises(TypeError, match="int"):
        llm.complete(QUERY, documents=[42])
    with pytest.raises(TypeError, match="dict"):
        llm.chat([ChatMessage(role="user", content=QUERY)], documents=[{"text": DOC}])


def test_too_long_context_is_trimmed_and_reported(llm, chat_decoder):
    long_doc = " ".join([DOC] * 300)  # far beyond the tiny model's 1024-token window
    r = llm.complete(QUERY, documents=[long_doc])
    info = r.additional_kwargs
    assert info["documents_trimmed"] is True and "trimmed" in info["notes"][0]
    given, kept = info["document_tokens"]
    assert kept < given
    assert len(chat_decoder.tokenizer(info["context_prompt"])["input_ids"]) + llm.max_new_tokens <= 1024


# -- streaming and async -----------------------------------------------------------------------------


def test_stream_complete_matches_complete_and_carries_signals(llm):
    full = llm.complete(QUERY, documents=[DOC])
    responses = list(llm.stream_complete(QUERY, documents=[DOC]))
    assert "".join(r.delta for r in responses).strip() == full.text
    assert responses[-1].text.strip() == full.text
    assert responses[-1].additional_kwargs["alphas"] == full.additional_kwargs["alphas"]


def test_stream_predict_matches_predict(llm):
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str=QUERY)
    text = llm.predict(qa, context_str=DOC)
    assert "".join(llm.stream(qa, context_str=DOC)).strip() == text
    assert last_info(llm)["method"] == "fides"


def test_async_variants_match_sync(llm):
    qa = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str=QUERY)
    expected = llm.predict(qa, context_str=DOC)
    msgs = [ChatMessage(role="user", content=QUERY)]

    async def run():
        a = await llm.apredict(qa, context_str=DOC)
        s = "".join([t async for t in await llm.astream(qa, context_str=DOC)])
        c = await llm.acomplete(QUERY, documents=[DOC])
        sc = [r async for r in await llm.astream_complete(QUERY, documents=[DOC])]
        ch = await llm.achat(msgs, documents=[DOC])
        sch = [r async for r in await llm.astream_chat(msgs, documents=[DOC])]
        return a, s, c, sc, ch, sch

    a, s, c, sc, ch, sch = asyncio.run(run())
    assert a == expected and s.strip() == expected
    assert sc[-1].text.strip() == c.text and sc[-1].additional_kwargs["method"] == "fides"
    assert sch[-1].message.content.strip() == ch.message.content


def test_async_does_not_block_the_event_loop(chat_decoder):
    decoder = FidesDecoder(chat_decoder.model, chat_decoder.tokenizer, max_new_tokens=3)
    # Every forward of the backbone takes 0.15 s, so each call decodes for at least 0.6 s.
    slow = ModelAnatomy.of(decoder.model).backbone.register_forward_pre_hook(lambda module, args: time.sleep(0.15))
    llm = FidesLLM.from_decoder(decoder)

    async def run(call):
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        task = asyncio.create_task(ticker())
        await call()
        task.cancel()
        return ticks

    async def stream_all():
        return [r async for r in await llm.astream_complete(QUERY, documents=[DOC])]

    try:
        assert asyncio.run(run(lambda: llm.acomplete(QUERY, documents=[DOC]))) >= 5
        assert asyncio.run(run(stream_all)) >= 5
    finally:
        slow.remove()


def test_async_stream_propagates_errors(llm):
    async def run():
        return [r async for r in await llm.astream_chat([ChatMessage(role="user", content=QUERY)], documents=[3.5])]

    with pytest.raises(TypeError, match="float"):
        asyncio.run(run())


def test_concurrent_calls_on_a_shared_decoder(chat_decoder):
    llms = [FidesLLM.from_decoder(chat_decoder, method=m, max_new_tokens=4) for m in ("fides", "cad", "standard")]
    expected = [llm.complete(QUERY, documents=[DOC]).text for llm in llms]
    results: dict[int, str] = {}

    def work(i):
        results[i] = llms[i % 3].complete(QUERY, documents=[DOC]).text

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(6)] == expected * 2


# -- engines (MockEmbedding, in-memory store) ---------------------------------------------------------


@pytest.fixture(scope="module")
def mock_index():
    docs = [Document(text=DOC), Document(text="Mount Kilimanjaro is in Peru.")]
    return VectorStoreIndex.from_documents(docs, embed_model=MockEmbedding(embed_dim=8))


@pytest.mark.parametrize("mode", ["compact", "refine", "simple_summarize", "tree_summarize"])
def test_query_engine_modes_put_nodes_in_the_context_path(llm, mock_index, mode):
    engine = mock_index.as_query_engine(llm=llm, response_mode=mode, similarity_top_k=2)
    engine.query(QUERY)
    infos = [h["info"] for h in llm.history]
    assert infos and all(i["method"] == "fides" for i in infos)
    contexts = " ".join(i["context_prompt"] for i in infos)
    assert DOC in contexts and "Kilimanjaro" in contexts
    assert all(DOC not in i["no_context_prompt"] or i["prompt_type"] == "refine" for i in infos)
    for i in infos:  # whatever is context in a stage is absent from that stage's no-context path
        assert i["context_variables"] and QUERY in i["no_context_prompt"]


def test_query_engine_streaming_and_aquery(llm, mock_index):
    response = mock_index.as_query_engine(llm=llm, streaming=True).query(QUERY)
    streamed = "".join(response.response_gen)
    assert streamed.strip() == llm.last_result.text
    response = asyncio.run(mock_index.as_query_engine(llm=llm).aquery(QUERY))
    assert str(response) == llm.last_result.text or str(response) == "Empty Response"
    assert last_info(llm)["method"] == "fides"


def test_empty_retrieval_keeps_llamaindex_empty_response(llm):
    empty = VectorStoreIndex(nodes=[], embed_model=MockEmbedding(embed_dim=8))
    before = len(llm.history)
    assert str(empty.as_query_engine(llm=llm).query(QUERY)) == "Empty Response"
    assert len(llm.history) == before


@pytest.mark.parametrize("chat_mode", ["context", "condense_plus_context"])
def test_chat_engines_put_retrieved_context_in_the_context_path(llm, mock_index, chat_mode):
    engine = mock_index.as_chat_engine(chat_mode=chat_mode, llm=llm, similarity_top_k=1)
    engine.chat(QUERY)
    engine.chat("And where is Kilimanjaro?")  # second turn: condense_plus_context condenses first
    info = last_info(llm)
    assert info["method"] == "fides" and info["context_variables"] == ["context_str"]
    assert "And where is Kilimanjaro?" in info["no_context_prompt"]
    assert info["context_prompt"] != info["no_context_prompt"]
    streamed = engine.stream_chat("Where is it?")
    assert "".join(streamed.response_gen).strip() == llm.last_result.text


# -- no_context_path='question' ------------------------------------------------------------------


def test_no_context_path_question_in_a_query_engine_and_a_chat(chat_decoder, plain_decoder):
    from fides_rag.prompts.raw import question_only_text, render_chat

    llm = FidesLLM(chat_decoder, max_new_tokens=3, no_context_path="question")
    expected = render_chat(chat_decoder.tokenizer, [{"role": "user", "content": question_only_text(QUERY)}])
    engine = VectorStoreIndex.from_documents(
        [Document(text=DOC)], embed_model=MockEmbedding(embed_dim=8)
    ).as_query_engine(llm=llm, response_mode="compact")
    engine.query(QUERY)
    info = last_info(llm)
    assert info["prompt_type"] == "text_qa" and DOC in info["context_prompt"] and info["no_context_prompt"] == expected
    llm.chat(
        [ChatMessage(role=MessageRole.SYSTEM, content="Be brief."), ChatMessage(role=MessageRole.USER, content=QUERY)],
        documents=[DOC],
    )
    assert last_info(llm)["no_context_prompt"] == expected
    plain = FidesLLM(plain_decoder, max_new_tokens=3, no_context_path="question")  # no chat template: the text itself
    plain.predict(DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str=QUERY), context_str=DOC)
    assert last_info(plain)["no_context_prompt"] == question_only_text(QUERY)


def test_no_context_path_question_without_a_query_keeps_the_emptied_prompt_with_a_note(chat_decoder):
    llm = FidesLLM(chat_decoder, max_new_tokens=3, no_context_path="question")
    llm.predict(PromptTemplate("Notes: {context_str}\nSummarise."), context_str=DOC)
    info = last_info(llm)
    assert DOC not in info["no_context_prompt"] and "Summarise." in info["no_context_prompt"]
    assert any("no_context_path='question' but no question was found" in n for n in info["notes"])
    with pytest.raises(ValueError, match="no_context_path must be one of"):
        FidesLLM(chat_decoder, no_context_path="neutral")
