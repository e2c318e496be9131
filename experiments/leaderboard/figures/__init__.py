"""Figures and summaries of experiments/leaderboard/ (presentation: read result tables only)."""
