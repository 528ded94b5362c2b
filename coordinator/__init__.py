"""The GemmaNet coordinator service.

app.py            Quart-Trio app factory (``create_app``) and ``run_instance``
versions.py       the check that a dependency is a release our workarounds know
cli.py            the ``gemmanet`` command line
cli_help.py       its help: the settings each command lists, -v on every command
cli_keys.py       ``gemmanet keys list|revoke|rotate`` and ``gemmanet nodes list|revoke``
cli_monitor.py    ``gemmanet monitor`` and ``gemmanet prove-takeover``: arguments, handlers
settings.py       GEMMANET_* environment settings
settings_docs.py  what each setting means, for the generated reference (docs/interface.md)
settings_values.py  how each setting's text becomes its value (the parsers VARIABLES names)
capacity.py       the operator file: per-node budgets and the model catalog
logging_setup.py  GEMMANET_LOG_FORMAT: the root log handler, text or one JSON object per line
log_redaction.py  the filter that masks secrets in every log line
url_credentials.py  credentials in a Redis or database URL: refused at start, hidden when shown
errors.py         the error hierarchy; each error knows its HTTP status / close code
api/              HTTP routes, request and response schemas, JSON errors, /openapi.json
core/             pure decisions: the cluster machine, placement, task tracking, node table,
                  registry snapshots, liveness, what status and nodes report
runtime/          the trio shell: node sockets, dispatch, membership, supervision, the lock
coordination/     shared coordination state (memory and Redis backends, with the exact
                  rate limiter) and the instance bus
store/            the durable SQL store (API keys, node tokens, tasks, ratings) and the
                  key and node lifecycle (revocation, expiry, rotation, the change log)
server/           ``gemmanet serve`` on Hypercorn, its workarounds, GC and heap tuning
monitor/          the elected residency monitor: election, host polls, fenced facts,
                  ``gemmanet monitor`` and ``gemmanet prove-takeover``
audit/            ``gemmanet audit``: is the cluster ready for the scheduler?
hosts/            direct model hosts: their wire formats, the calls an instance makes to
                  them, reading the monitor's facts for placement
"""

__version__ = "0.1.0"
