"""The lean client: RESP parsed by hiredis over a trio socket, about a third of coredis's cost
per command; the bus's only client and the hot-path scripts' (single Redis, Cluster, Sentinel).

connection.py    its RESP connection
pipeline.py      one writer that pipelines, replies handed back in order
lane.py          the link's lean lane: the pipeline at the master of the moment (PUBLISH, the
                 admission and release scripts), and the subscriptions' connections
subscription.py  its SUBSCRIBE: the iterating task reads the socket itself
"""
