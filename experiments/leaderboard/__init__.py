"""Across the papers: every bound of harness.bounds.registry on every model (bound_leaderboard)."""
