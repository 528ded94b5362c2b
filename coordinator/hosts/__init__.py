"""Direct model hosts: the HTTP side of calling an Ollama or OpenAI-compatible server.

    host_client.py   the httpx side of one call: open the stream, a bounded error body,
                     httpx's errors as short HostErrors
    host_calls.py    a requesting instance runs its tasks on direct hosts: one cancellable
                     trio task per call, its output fed back to the cluster machine
    facts_reader.py  reads the monitor's host facts for placement and writes the hosts'
                     lease facts

The wire formats themselves (what Ollama and OpenAI-compatible servers are sent, how their
streams are read) are sans-IO in protocol/model_servers/, shared with the node agent, which must
not import the coordinator. Whether a host may be placed on is decided in
coordinator/core/hosts/direct_hosts.py (pure).
"""
