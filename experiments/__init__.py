"""Experiments: one module per paper figure family; each registers with harness.registry."""
