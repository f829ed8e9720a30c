from concurrent.futures import ThreadPoolExecutor

from fides_rag import FidesDecoder, load_model
from fides_rag.batching import RequestBatcher

model, tokenizer = load_model("smollm2-135m-instruct")
decoder = FidesDecoder(model, tokenizer, method="fides", max_new_tokens=16)
batcher = RequestBatcher(decoder)  # every caller shares one batched decode

documents = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."]
questions = ["In which city is the Eiffel Tower located?", "In which country is the Eiffel Tower?"]
with ThreadPoolExecutor(8) as pool:  # from asyncio tasks: await batcher.agenerate(...)
    answers = list(pool.map(lambda q: batcher.generate(q, documents).text, questions))
print(answers)
future = batcher.submit(questions[0], documents, method="cad")  # a concurrent.futures.Future
print(future.result().text)
for delta in batcher.stream(questions[1], documents):  # batcher.astream for asyncio
    print(delta, end="", flush=True)
print()
