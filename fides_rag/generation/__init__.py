"""The decoder's rooms, one job each: settings, options (the typed keywords of the public calls), prompting,
layout, gather, kv_cache, hooks, choosing, stopping, streaming, results and validation.
`fides_rag.decoder.FidesDecoder` ties them into the loop."""
