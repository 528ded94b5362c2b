"""The Ollama-compatible API (/api/chat, /api/generate, /api/tags, /api/ps, /api/version).

routes.py   the routes
schemas.py  their bodies, in Ollama's shapes, and a request as a task's input and options
errors.py   errors of those routes, in Ollama's shape
"""
