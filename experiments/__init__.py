"""The experiments, one package per paper family: castin/ (How Smooth Is Attention?), jasmin/ (JaSMin), lofast/
(LoFAST) and leaderboard/ (every bound on every model). In each, one module per experiment (registered with
harness.catalog under the name its results folder carries), the family's shared compute beside them, and its
figures and summaries under figures/ (presentation: read result tables only, never part of a cell's key).
figures/ here holds what the families' figures share (names, facets, notes, log-log fits)."""
