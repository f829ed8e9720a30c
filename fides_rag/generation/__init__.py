"""The decoder's parts, one job each, in two rooms and the request side:

- `engine/`: continuous batching and what it is made of: the scheduler and its step plan, the requests in flight,
  the running batch (exact mode's ragged KV cache; fast mode's fixed KV pool and its attention over each row's own
  blocks), chunked prefill, the prefix cache, the captured decode step, one step's gather, combine and choice;
- `grammar/`: grammar-constrained decoding (llguidance): constraints, token bitmasks, the shortest legal completion;
- here: the request side: the one request builder, request options, settings, prompting, the path table, stopping,
  detokenisation, streaming, results and validation.

`fides_rag.decoder.FidesDecoder` is the public facade over them; nothing here imports it."""
