from fides_rag import FidesConfig, FidesDecoder, PromptPair, get_method, load_model

model, tokenizer = load_model("gemma3-270m")
decoder = FidesDecoder(model, tokenizer, method="fides", config=FidesConfig(), max_new_tokens=16)

question = "In which city is the Eiffel Tower located?"
docs = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."]
print(decoder.generate(question, documents=docs, method="standard").text)  # Paris, France   (memory)
r = decoder.generate(question, documents=docs)                              # Rome            (evidence)
print(r.text, [(s.token, round(s.alpha, 3)) for s in r.steps])              # Rome [(' Rome', 0.43...), ...]
print(decoder.generate(question, docs, method=get_method("cad", alpha=0.5)).text)  # a configured rule

questions = [question, "Who wrote Hamlet?"]
documents_per_question = [docs, ["Hamlet is a tragedy written by Charles Dickens around 1600."]]
batch = decoder.generate_batch(questions, documents_per_question, method="fides")  # one forward per step for all
by_method = decoder.generate_batch(questions, documents_per_question, methods=["standard", "cad", "fides"])  # one shared prefill
print([r.text for r in batch], {m: [r.text for r in rs] for m, rs in by_method.items()})

for delta in decoder.stream(question, docs):
    print(delta, end="", flush=True)
print()
context_prompt = "Document: The Eiffel Tower is in Rome.\nQuestion: Where is the Eiffel Tower?\nAnswer:"
no_context_prompt = "Question: Where is the Eiffel Tower?\nAnswer:"
print(decoder.generate(PromptPair(context_prompt, no_context_prompt), stop=["\n"]).text)  # your own two prompts
