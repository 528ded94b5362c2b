"""The HTTP API of INTERFACE.md: request schemas, routes, JSON errors, server-sent events.

routes.py           the native routes (/api/v1/..., /healthz)
schemas.py          their request and response Structs
responses.py        typed JSON responses
errors.py           every error as the native JSON body
openapi.py          /openapi.json built from the Structs
metrics_http.py     GET /metrics (on the API port, or on GEMMANET_METRICS_PORT)
node_websocket.py   /ws/node served from the ASGI events below Quart (every node message)
system_health.py    the System Health page (/system-health) and GET /api/v1/cluster
health_schemas.py   the body of GET /api/v1/cluster
health_page/        the page's HTML, script and stylesheet (package data, not a package)
openai_routes.py    the OpenAI-compatible routes (/v1/chat/completions, /v1/models)
openai_schemas.py   their bodies, in OpenAI's shapes
openai_prompt.py    the prompt a node gets for a list of chat messages
openai_errors.py    errors of the /v1 routes, in OpenAI's shape
"""
