"""The requester side of the core: the tasks this instance's clients asked for.

requester.py      ``Requester``: what the owners answer, and how each request ends
attempts.py       placement attempts: the lease, the assign sent to its owner, placing again
request_state.py  a request's lifecycle: ``RequestState``, the moves allowed, the record
candidates.py     where a request's candidate nodes come from (all, or a sample of many)
"""
