"""The decode engine: continuous batching over both paths of every request in flight (`engine.py`), the scheduler and
its step plan, the running decode (one runner over a KV store: exact mode's ragged KV cache, or fast mode's fixed KV
pool with attention over each row's own blocks and the captured step), chunked prefill, the prefix cache, and one
step's gather, combine and choice. Only `fides_rag.decoder` and the rest of `fides_rag.generation` import these
modules."""
