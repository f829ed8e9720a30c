"""Concurrent LlamaIndex calls (acomplete, query engines' aquery) share batched decodes through fides-rag's
request batcher, and each answer equals the same call made alone."""

from __future__ import annotations

import asyncio

from llama_index.core import Document, SummaryIndex
from llama_index.llms.fides import FidesLLM

from fides_rag import FidesDecoder
from fides_rag.testing import build_tiny_model, build_tokenizer

CALLS = [
    ("What is the capital of France?", ["Lyon is the capital of France."], dict(method="fides")),
    ("Who chose Canberra?", ["Canberra was chosen as a compromise."], dict(method="cad", stop=["e"])),
    ("What jumps?", ["The quick brown fox jumps."], dict(method="adacad")),
    ("Which river?", ["Paris is on the Seine.", "Lyon is on the Rhone."], dict(method="dvd")),
    ("Who wrote it?", ["It was written by Ada."], dict(method="fides", max_new_tokens=3)),
    ("What is the capital?", ["Rome is the capital of France."], dict(method="standard", stop=["a", "o"])),
    ("Where is it?", ["It is in Canberra."], dict(method="cad")),
    ("How tall is it?", ["It is 300 metres tall."], dict(method="fides", stop=["m"])),
]


def fresh_decoder() -> FidesDecoder:
    tok = build_tokenizer()
    return FidesDecoder(build_tiny_model("llama", len(tok)), tok, max_new_tokens=8)


def test_concurrent_acompletes_batch_and_equal_each_call_alone():
    decoder = fresh_decoder()
    llm = FidesLLM(decoder=decoder, batch_window_s=0.2)
    alone = [llm.complete(q, documents=d, **kw).text for q, d, kw in CALLS]
    before = decoder.stats.admissions

    async def together():
        return await asyncio.gather(*(llm.acomplete(q, documents=d, **kw) for q, d, kw in CALLS))

    assert [r.text for r in asyncio.run(together())] == alone
    stats = decoder.stats
    assert stats.admissions - before < len(CALLS) and stats.largest_batch >= 2, stats  # shared steps


def test_concurrent_query_engine_aqueries_equal_alone():
    decoder = fresh_decoder()
    llm = FidesLLM(decoder=decoder, batch_window_s=0.2)
    engines = [
        SummaryIndex.from_documents([Document(text=t) for t in d]).as_query_engine(llm=llm) for _, d, _ in CALLS[:4]
    ]
    alone = [str(engine.query(q)) for engine, (q, _, _) in zip(engines, CALLS)]

    async def together():
        return await asyncio.gather(*(engine.aquery(q) for engine, (q, _, _) in zip(engines, CALLS)))

    assert [str(r) for r in asyncio.run(together())] == alone


def test_batching_is_set_when_the_llm_is_built_not_at_each_call():
    decoder = fresh_decoder()
    llm = FidesLLM(decoder=decoder, max_batch_size=3, batch_window_s=0.01)
    assert (decoder.limits.max_requests, decoder.limits.window_s) == (3, 0.01)
    decoder.configure(max_requests=5)
    llm.complete("Who wrote it?", documents=["It was written by Ada."], max_new_tokens=2)
    assert decoder.limits.max_requests == 5
