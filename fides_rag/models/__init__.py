"""Models: loading a causal LM and its tokenizer, fetching larger backbones, the user's model cache, memory checks."""
