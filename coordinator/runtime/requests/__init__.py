"""The request side of an instance: the tasks its clients ask for, from admission to record.

task_requests.py  start, end, rate and record its clients' tasks (``TaskRequests``)
admission.py      capacity leases and the shared admission queue: the shell of core/admission/
rate_limit.py     the per-API-key rate limit, exact across instances
affinity.py       prefix affinity: the prediction a request is placed with, and its records
task_handle.py    what a request handler holds while its task runs
task_recorder.py  task records written in batches, off the request path
task_log.py       the log lines about one task, with its task and node ids
"""
