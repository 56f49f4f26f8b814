"""Failures and goodput: a whole training run simulated with the ``[faults]`` table
(``montecarlo.py``: the run as a renewal process, with the closed forms beside it;
``run.py``: Scenario + token budget -> the goodput figures)."""
