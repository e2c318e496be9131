"""Figures and summaries of experiments/lofast/ (presentation: read result tables only)."""
