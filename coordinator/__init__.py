"""The GemmaNet coordinator service.

app.py            Quart-Trio app factory (``create_app``) and HTTP routes
cli.py            the ``gemmanet`` command line
settings.py       GEMMANET_* environment settings
errors.py         the error hierarchy; each error knows its HTTP status / close code
core/             pure decisions: placement, task tracking, node table, rate limiting
runtime/          the trio shell: node sockets, dispatch, instance supervision
coordination/     shared coordination state: embedded memory backend and Redis backend
store/            the durable SQL store (API keys, node tokens, tasks, ratings)
"""

__version__ = "0.1.0"
