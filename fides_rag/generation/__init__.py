"""The decoder's rooms, one job each: the engine (continuous batching) and what it is made of: requests (the
one request builder), settings, options, prompting, layout, lanes, running (the batch's tensors), kv_cache,
hooks, gather, step, choosing, stopping, detokenize, tickets, streaming, results and validation.
`fides_rag.decoder.FidesDecoder` is the public facade over them; nothing here imports it."""
