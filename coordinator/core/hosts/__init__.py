"""Direct model hosts as placement candidates, pure (the calls and the facts reader are the
shell's: coordinator/hosts/).

direct_hosts.py  whether a direct model host may be placed on now (fail closed)
gate.py          whether placement on direct hosts is switched on (the enablement gate)
"""
