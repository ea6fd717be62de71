"""Datasets, the demo dataset and the rank-independent sampler."""
