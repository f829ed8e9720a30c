"""The decode engine: continuous batching over both paths of every request in flight (`engine.py`), the scheduler and
its step plan, the running batch in exact mode (ragged KV cache) and fast mode (fixed KV pool, attention over each
row's own blocks, the captured step), chunked prefill, the prefix cache, and one step's gather, combine and choice.
Only `fides_rag.decoder` and the rest of `fides_rag.generation` import these modules."""
