"""What operators watch: the System Health page, the JSON it polls, and /metrics.

routes.py   the System Health page (/system-health) and GET /api/v1/cluster
schemas.py  the body of GET /api/v1/cluster
metrics.py  GET /metrics (on the API port, or on GEMMANET_METRICS_PORT)
page/       the page's HTML, script and stylesheet (package data, not a package)
"""
