import asyncio

from fides_rag import FidesDecoder, load_model

model, tokenizer = load_model("smollm2-135m-instruct")
decoder = FidesDecoder(model, tokenizer, method="fides", max_new_tokens=16)
docs = ["Mount Everest is located in the Alps in Switzerland."]


async def main() -> None:
    result = await decoder.agenerate("Where is Mount Everest?", docs)  # the event loop stays free
    print(result.text, result.finish_reason)
    async for delta in decoder.astream("In which country is Mount Everest?", docs):
        print(delta, end="", flush=True)
    print()
    questions = ["Where is Mount Everest?", "In which mountain range is Mount Everest?", "In which country is Mount Everest?"]
    results = await asyncio.gather(*(decoder.agenerate(q, docs) for q in questions))  # decoded together
    print([r.text for r in results])


asyncio.run(main())
