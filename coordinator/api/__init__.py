"""The HTTP API: the native routes, the OpenAI- and Ollama-compatible ones, JSON errors,
server-sent events, the health page and /metrics.

routes.py           the native routes (/api/v1/..., /healthz) and the opening every task route shares
schemas.py          their request and response Structs
responses.py        typed JSON responses
errors.py           every error as the native JSON body
task_runs.py        one task as every route runs it (whole, or streamed event by event)
rate_charge.py      a task request's rate limit, counted by its admission ask or by its error
openapi.py          /openapi.json built from the Structs
node_websocket.py   /ws/node served from the ASGI events below Quart (every node message)
sse.py              server-sent events: one bytes object per event, a delta without a rebuild
usage/              GET /api/v1/usage: tokens per key and model over a time window
admin/              /api/v1/admin/...: API keys and nodes (list, create, revoke, rotate), operators only
health/             what operators watch: the System Health page, GET /api/v1/cluster, GET /metrics
openai/             the OpenAI-compatible routes (/v1/chat/completions, /v1/completions, /v1/models)
ollama/             the Ollama-compatible routes (/api/chat, /api/generate, /api/tags, /api/ps,
                    /api/version)
"""
