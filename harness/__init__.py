"""AttnLip: the local Lipschitz constant of dot-product self-attention, three papers side by side."""
__version__ = "0.1.0"
