"""Presentation shared by the families' figures: model and layer names, facets, setting notes, log-log fits."""
