"""Figures and summaries of experiments/jasmin/ (presentation: read result tables only)."""
