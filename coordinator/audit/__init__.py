"""``gemmanet audit``: is the cluster ready for the scheduler to place on direct hosts?
(docs/direct-hosts.md, docs/interface.md for the report and the exit codes.)

findings.py   pure: the settings and what was read -> the report, its reasons and exit code
nodes.py      pure: the verdict on each agent node (facts fresh, budgets, catalog)
gate.py       pure: the placement switch in the report; whether --enable may turn it on
observe.py    the reads: monitor lease, host facts, instance registry; ``--probe`` polls hosts
render.py     the report as a readable table
command.py    ``gemmanet audit``: observe, judge, print, exit code; --enable/--disable
"""
