"""The OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models).

routes.py   the routes
schemas.py  their bodies, in OpenAI's shapes
params.py   their messages and parameters as a task's conversation and options
streams.py  their streamed answers (OpenAI's chunk formats)
errors.py   errors of the /v1 routes, in OpenAI's shape
"""
