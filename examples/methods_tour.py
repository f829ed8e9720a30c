from fides_rag import FidesConfig, FidesDecoder, available_methods, get_method, load_model

model, tokenizer = load_model("smollm2-135m-instruct")
decoder = FidesDecoder(model, tokenizer, max_new_tokens=8)
question = "In which city is the Eiffel Tower located?"
docs = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.", "The tower was built for the 1889 World's Fair."]
print(available_methods())  # standard, cad, adacad, fides, and the other registered baselines

methods = {  # label -> a method name or a configured rule
    "standard": "standard",
    "cad a=0.5": get_method("cad", alpha=0.5),
    "adacad floor=0.3": get_method("adacad", floor=0.3),
    "fides": "fides",
    "fides without shift": get_method("fides", config=FidesConfig().without("shift")),
    "fides opposition only": get_method("fides", config=FidesConfig().with_signals("opposition")),
    "fides fixed a=1": get_method("fides", config=FidesConfig().with_fixed_alpha(1.0)),
    "dola low layers": get_method("dola", layers="low"),
    "coiecd": get_method("coiecd", alpha=1.0, threshold_ratio=4),
    "cocoa adaptive": get_method("cocoa", alpha="adaptive"),
    "decore, explicit heads": get_method("decore", heads={19: [6], 18: [3, 4]}),
}
for label, result in decoder.generate(question, docs, methods=methods).items():  # one shared prefill
    print(f"{label:>22}: {result.text!r}  records: {sorted(result.steps[0].values)}")
dvd = decoder.generate(question, docs, method=get_method("dvd", dynamic_weight=False, beta=0.25, gamma=0.2))
print("dvd (one path per document):", repr(dvd.text))
