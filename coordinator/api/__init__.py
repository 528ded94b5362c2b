"""The HTTP API of INTERFACE.md: request schemas, routes, JSON errors, server-sent events.

routes.py           the native routes (/api/v1/..., /healthz)
schemas.py          their request and response Structs
usage_routes.py     GET /api/v1/usage: tokens per key and model over a time window
usage_schemas.py    its query and response Structs
responses.py        typed JSON responses
errors.py           every error as the native JSON body
task_runs.py        one task as every route runs it (whole, or streamed event by event)
openapi.py          /openapi.json built from the Structs
metrics_http.py     GET /metrics (on the API port, or on GEMMANET_METRICS_PORT)
node_websocket.py   /ws/node served from the ASGI events below Quart (every node message)
system_health.py    the System Health page (/system-health) and GET /api/v1/cluster
health_schemas.py   the body of GET /api/v1/cluster
health_page/        the page's HTML, script and stylesheet (package data, not a package)
openai_routes.py    the OpenAI-compatible routes (/v1/chat/completions, /v1/completions,
                    /v1/models)
openai_schemas.py   their bodies, in OpenAI's shapes
openai_params.py    their messages and parameters as a task's conversation and options
openai_streams.py   their streamed answers (OpenAI's chunk formats)
openai_errors.py    errors of the /v1 routes, in OpenAI's shape
ollama_routes.py    the Ollama-compatible routes (/api/chat, /api/generate, /api/tags, /api/ps,
                    /api/version)
ollama_schemas.py   their bodies, in Ollama's shapes, and a request as a task's input and options
ollama_errors.py    errors of those routes, in Ollama's shape
"""
