from fides_rag import FidesConfig, FidesDecoder, PromptPair, get_method, load_model

model, tokenizer = load_model("gemma3-270m")
decoder = FidesDecoder(model, tokenizer, method="fides", config=FidesConfig(), max_new_tokens=16)

question = "In which city is the Eiffel Tower located?"
docs = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."]
print(decoder.generate(question, docs, method="standard").text)  # Paris, France   (memory)
r = decoder.generate(question, docs)                              # Rome            (evidence)
print(r.text, [(s.token, round(s.alpha, 3)) for s in r.steps])    # Rome [(' Rome', 0.43...), ...]
print(decoder.generate(question, docs, method=get_method("cad", alpha=0.5)).text)  # a configured rule
by_method = decoder.generate(question, docs, methods=["standard", "cad", "fides"])  # one shared prefill
print({label: result.text for label, result in by_method.items()})

questions = [question, "Who wrote Hamlet?"]
documents_per_question = [docs, ["Hamlet is a tragedy written by Charles Dickens around 1600."]]
batch = decoder.generate_batch(questions, documents_per_question, method="fides")  # one forward per step for all
print([result.text for result in batch])

for delta in decoder.stream(question, docs):
    print(delta, end="", flush=True)
print()
context_prompt = "Document: The Eiffel Tower is in Rome.\nQuestion: Where is the Eiffel Tower?\nAnswer:"
no_context_prompt = "Question: Where is the Eiffel Tower?\nAnswer:"
pair = PromptPair(context=context_prompt, no_context=no_context_prompt)  # your own two prompts
print(decoder.generate(pair, stop=["\n"]).text)
