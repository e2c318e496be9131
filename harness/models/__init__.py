"""Model adapters, small ViTs, regularizers and certification."""
