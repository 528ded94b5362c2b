"""The elected residency monitor: one primary polls every direct host of the operator file and
writes fenced facts; standbys wait to take over (docs/direct-hosts.md).

timing.py          the start-up timing bound every monitor and instance checks
election.py        one candidate's hold on the monitor lease and its fencing token
poller.py          one poll of a direct host (Ollama /api/ps + /api/tags, OpenAI /v1/models)
loop.py            the monitor loop: elect, poll, write fenced facts, renew; standby retries
telemetry_poll.py  the primary's polls of the operator file's telemetry agents (beside the loop)
command.py         ``gemmanet monitor``: the loop as a process of its own
prove_takeover.py  ``gemmanet prove-takeover``: pause the primary, judge the handover
takeover_run.py    one prove-takeover run: the processes, the observations, the numbers
deployed_takeover.py  ``--against-deployed``: the same gate on the monitors that really run
ollama_listing.py  the Ollama host prove-takeover serves: /api/tags and /api/ps, no generation
"""
