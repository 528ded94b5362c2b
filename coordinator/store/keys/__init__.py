"""API keys and node tokens in the store: their secrets, their lifecycle, and authenticating
with them.

lifecycle.py   listing, revoking, rotating keys and nodes; the change log; the revocation epoch
auth.py        the authentication cache, emptied within a second of a revocation anywhere
cache.py       a small bounded TTL cache of positive authentication results
last_used.py   when each key was last used, noted per request, written in batches
expiry.py      key lifetimes (``30d``) and whether a node's "online" record is still fresh
tokens.py      generating, hashing and comparing the secrets (API keys, node tokens)
"""
