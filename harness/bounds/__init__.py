"""Bounds on the local Lipschitz constant of self-attention, one module per paper."""
