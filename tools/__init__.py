"""Operator and test tooling that runs beside the coordinator.

* ``tools.node_agent`` - the ``gemmanet node`` agent: connects out to a coordinator and serves
  tasks with an echo, Ollama or OpenAI-compatible backend.
* ``tools.fakes`` - test doubles of external model servers (Ollama, OpenAI-compatible) that
  speak the real wire formats, in-process or as ``python -m tools.fakes.ollama --port P``.
"""
