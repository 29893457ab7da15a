"""The target: the system under test this project ships, apart from the tool's stages.

``engine`` (a torch model with paged KV, a prefix cache and continuous batching), ``cache`` (the
response cache stack: L1 LRU, L2 Redis, L3 FAISS, a Bloom filter) and ``server`` (the
OpenAI-compatible streaming front end, ``harness serve``). The tool measures it over HTTP like any
other OpenAI-compatible server (vLLM, TGI, llama.cpp); the experiments start it as a child process,
and the analyses that model it use its own definitions (the cache's tier file, the engine's eviction
rule) rather than copies.
"""
