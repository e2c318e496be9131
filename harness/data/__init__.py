"""Offline-first text and image loaders."""
