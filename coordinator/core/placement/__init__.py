"""Which node gets a task, pure: ranking the candidates, prefix affinity, whether a model fits.

choose.py    which node gets a task: load, rating, weight, sampling among many
affinity.py  which node is predicted to hold a request's prefix, and its worth
fit.py       whether a model can ever fit on the nodes serving it
"""
