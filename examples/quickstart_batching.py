from concurrent.futures import ThreadPoolExecutor

from fides_rag import FidesDecoder, load_model

model, tokenizer = load_model("smollm2-135m-instruct")
decoder = FidesDecoder(model, tokenizer, method="fides", max_new_tokens=16)  # one engine serves every caller

documents = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."]
questions = ["In which city is the Eiffel Tower located?", "In which country is the Eiffel Tower?"]
with ThreadPoolExecutor(8) as pool:  # from asyncio tasks: await decoder.agenerate(...)
    answers = list(pool.map(lambda q: decoder.generate(q, documents).text, questions))
print(answers)
handle = decoder.submit(questions[0], documents, method="cad")  # returns at once; handle.future is a Future
print(handle.result().text)
for delta in decoder.stream(questions[1], documents):  # decoder.astream for asyncio
    print(delta, end="", flush=True)
print()
