"""Direct model hosts: the HTTP side of calling an Ollama or OpenAI-compatible server.

    host_client.py   the wire formats: Ollama's NDJSON stream, OpenAI's server-sent events,
                     and one short error for every way a host can fail (the node agent's
                     HTTP backends use the same code)
    host_calls.py    a requesting instance runs its tasks on direct hosts: one cancellable
                     trio task per call, its output fed back to the cluster machine
    facts_reader.py  reads the monitor's host facts for placement and writes the hosts'
                     lease facts

Whether a host may be placed on is decided in coordinator/core/direct_hosts.py (pure).
"""
