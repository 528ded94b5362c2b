"""Host telemetry: samples of a machine's CPU, memory and GPUs (shape: ``protocol.telemetry``).

Used by the node agent (sent in its heartbeats) and by ``gemmanet telemetry-agent`` (served
over HTTP); the coordinator only stores and shows what it receives
(``coordinator/runtime/nodes/telemetry.py``). It lives with the node agent because both run on
the model host, and the agent imports nothing of the coordinator.

sampler.py        one sample (CPU busy over an interval without blocking trio), the latest-sample loop
sysfs_gpu.py      AMD GPUs from the kernel's DRM sysfs files, under a configurable root
nvml_gpu.py       NVIDIA GPUs through NVML (``nvidia-ml-py``), when present
agent_server.py   ``gemmanet telemetry-agent``: the latest sample over HTTP
"""
