"""GET /api/v1/usage: tokens per key and model over a time window.

routes.py   the route (a key sees its own usage; an operator key any key's, or every key's)
schemas.py  its query and response Structs
"""
