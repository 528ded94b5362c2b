"""Direct model hosts: the HTTP side of calling an Ollama or OpenAI-compatible server.

    generation.py    what a server is asked (the model, a prompt or a conversation, the
                     options) and what it reports at the end (usage, finish reason)
    ollama_wire.py   Ollama's own API: /api/chat and /api/generate, NDJSON streams
    openai_wire.py   the OpenAI-compatible API: /v1/chat/completions and /v1/completions,
                     server-sent events
    host_client.py   what both wire formats share: one short error for every way a host can
                     fail, the usage counts read safely (the node agent's HTTP backends use
                     the same code)
    host_calls.py    a requesting instance runs its tasks on direct hosts: one cancellable
                     trio task per call, its output fed back to the cluster machine
    facts_reader.py  reads the monitor's host facts for placement and writes the hosts'
                     lease facts

Whether a host may be placed on is decided in coordinator/core/direct_hosts.py (pure).
"""
