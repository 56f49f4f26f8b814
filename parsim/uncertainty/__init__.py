"""Predictions with error bars: Monte Carlo over per-op-part duration draws in the engines
(``sampled.py``: the cost table that draws; ``band.py``: samples -> P5/P50/P95)."""
