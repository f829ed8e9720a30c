from fides_rag import FidesDecoder, get_gate, get_method, load_model

model, tokenizer = load_model("smollm2-135m-instruct")
decoder = FidesDecoder(model, tokenizer, max_new_tokens=8)
question = "In which city is the Eiffel Tower located?"
conflict = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."]
agreeing = ["The Eiffel Tower is a wrought-iron lattice tower in Paris, France."]

methods = {  # label -> a method name (rule+gate) or a configured rule behind a configured gate
    "fides": "fides",
    "fides+agree": "fides+agree",
    "fides+nwcad": "fides+nwcad",
    "fides+defer": "fides+defer",
    "cad+nwcad tau=0.1": get_method("cad", alpha=1.0, gate=get_gate("nwcad", tau=0.1)),
}
for docs in (conflict, agreeing):
    for label, result in decoder.generate(question, docs, methods=methods).items():  # one shared prefill
        chosen_by = ["rule" if not s.values.get("gate") else "gate" for s in result.steps]
        print(f"{label:>18}: {result.text!r} {chosen_by}")
