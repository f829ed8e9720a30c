"""Concurrent LangChain calls share batched decodes on the decoder's one engine, and each answer
equals the same call made alone."""

from __future__ import annotations

import asyncio

from fides_rag import FidesDecoder
from fides_rag.testing import build_tiny_model, build_tokenizer
from langchain_fides import ChatFides, FidesLLM

CALLS = [
    dict(input="What is the capital of France?", documents=["Lyon is the capital of France."], method="fides"),
    dict(input="Who chose Canberra?", documents=["Canberra was chosen as a compromise."], method="cad", stop=["e"]),
    dict(input="What jumps?", documents=["The quick brown fox jumps."], method="adacad"),
    dict(input="Which river?", documents=["Paris is on the Seine.", "Lyon is on the Rhone."], method="dvd"),
    dict(input="Who wrote it?", documents=["It was written by Ada."], method="fides", max_new_tokens=3),
    dict(
        input="What is the capital?", documents=["Rome is the capital of France."], method="standard", stop=["a", "o"]
    ),
    dict(input="Where is it?", documents=["It is in Canberra."], method="cad"),
    dict(input="How tall is it?", documents=["It is 300 metres tall."], method="fides", stop=["m"]),
]


def fresh_decoder() -> FidesDecoder:
    tok = build_tokenizer(chat=True)
    return FidesDecoder(build_tiny_model("llama", len(tok)), tok, max_new_tokens=8)


def test_concurrent_ainvokes_batch_and_equal_each_call_alone():
    decoder = fresh_decoder()
    llm = FidesLLM(decoder=decoder, batch_window_s=0.2)
    alone = [llm.invoke(**call) for call in CALLS]
    before = decoder.stats.admissions

    async def together():
        return await asyncio.gather(*(llm.ainvoke(**call) for call in CALLS))

    assert asyncio.run(together()) == alone
    stats = decoder.stats
    assert stats.admissions - before < len(CALLS) and stats.largest_batch >= 2, (
        stats
    )  # shared steps, not one decode per call


def test_batch_decodes_items_together(decoder):
    decoder = fresh_decoder()
    llm = FidesLLM(decoder=decoder, batch_window_s=0.2, method="cad")
    questions = [c["input"] for c in CALLS[:4]]
    alone = [llm.invoke(q, documents=["Lyon is the capital of France."]) for q in questions]
    before = decoder.stats.admissions
    assert llm.batch(questions, documents=["Lyon is the capital of France."]) == alone
    assert decoder.stats.admissions - before < len(questions)


def test_chat_model_concurrent_calls_equal_alone():
    decoder = fresh_decoder()
    chat = ChatFides(decoder=decoder, batch_window_s=0.2)
    alone = [chat.invoke(c["input"], documents=c["documents"], method=c["method"]).content for c in CALLS[:4]]

    async def together():
        return await asyncio.gather(
            *(chat.ainvoke(c["input"], documents=c["documents"], method=c["method"]) for c in CALLS[:4])
        )

    assert [m.content for m in asyncio.run(together())] == alone


def test_batching_is_set_when_the_model_is_built_not_at_each_call():
    decoder = fresh_decoder()
    chat = ChatFides(decoder=decoder, max_batch_size=3, batch_window_s=0.01)
    assert (decoder.limits.max_requests, decoder.limits.window_s) == (3, 0.01)
    decoder.configure(max_requests=5)
    chat.invoke("Who wrote it?", documents=["It was written by Ada."], max_new_tokens=2)
    assert decoder.limits.max_requests == 5
