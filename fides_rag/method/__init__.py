"""The method: FIDES's signals and constants, the logit lens over a model's anatomy and retrieval heads."""
