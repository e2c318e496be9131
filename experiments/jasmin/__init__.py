"""JaSMin (Yudin et al.): the softmax-Jacobian bound g_1, Theorem 3 and 4, and the JaSMin regularizer against
Specformer on trained ViTs. Shared compute: common (models, layers, ViT training budgets), grids (the sweep and
downstream grids)."""
