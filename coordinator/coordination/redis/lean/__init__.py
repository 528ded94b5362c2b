"""The lean pub/sub client: RESP parsed by hiredis over a trio socket, about a third of
coredis's cost per message; the bus's only client (single Redis, Cluster, Sentinel).

connection.py    its RESP connection
publisher.py     its PUBLISH: one writer that pipelines, replies handed back in order
subscription.py  its SUBSCRIBE: the iterating task reads the socket itself
"""
