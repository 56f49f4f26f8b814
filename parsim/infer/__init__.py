"""Inference: prefill and decode of a scenario's ``[inference]`` table (``parsim infer``)."""
from parsim.infer.run import InferJob, load_inference, run_inference

__all__ = ["InferJob", "load_inference", "run_inference"]
