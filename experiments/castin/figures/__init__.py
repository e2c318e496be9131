"""Figures and summaries of experiments/castin/ (presentation: read result tables only)."""
