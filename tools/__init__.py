"""Operator and test tooling that runs beside the coordinator.

* ``tools.node_agent`` - the ``gemmanet node`` agent: connects out to a coordinator and serves
  tasks with an echo, Ollama or OpenAI-compatible backend.
* ``tools.fakes`` - test doubles of external model servers (Ollama, OpenAI-compatible) that
  speak the real wire formats, in-process or as ``python -m tools.fakes.ollama --port P``.
* ``tools.demo`` - ``gemmanet demo``: a coordinator, a demo key and one echo node.
* ``tools.loadtest`` - ``gemmanet loadtest``: the seed's load profile against real processes.
* ``tools.bench`` - benchmarks that print ratios measured side by side.
* ``tools/run-tests.sh`` - the whole test suite, installing what it needs.
* ``tools.docs_settings`` - writes the settings tables of docs/interface.md from the settings.
* ``tools.docs_site`` - the MkDocs hook that puts the OpenAPI document into the docs site.
"""
