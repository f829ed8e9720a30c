"""Grammar-constrained decoding: constraints compiled by llguidance (`constraint.py`), token bitmasks (`masks.py`),
the shortest legal completion of a grammar (`closing.py`), the JSON-schema keywords enforced (`schema_support.py`) and
a transformers logits processor (`processor.py`)."""
