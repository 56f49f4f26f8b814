"""Validation backend: the lowered schedule executed for real on torch.distributed.

The only package that imports torch (in runtime, model, worker, bench, probe, reference,
timing). Torch-free modules: scale (the scaled scenario), launch (processes, timeout),
compare (predicted vs measured), report, repredict (a record predicted again), cli. Importing this package does not import torch.
"""
