"""Shared test settings: deterministic, single-threaded torch, quick hypothesis profile."""

import os

import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(int(os.environ.get("FUNCGRAPH_TEST_THREADS", "1")))

settings.register_profile(
    "funcgraph",
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("funcgraph")
