"""A request waiting for a lease, pure: what the admission machine decides and why it gives up.

machine.py    ``AdmissionMachine``: ask again, wait, pass a wake, give up
decisions.py  what the admission machine decides (one class per decision)
errors.py     the errors a request waiting for a lease fails with
retries.py    when to make a store call again (a timeout, a failed release), when not
"""
