"""LoFAST (Havens et al., ICML 2024): zeta(X), ||M_l(X)||, Theorem 1's delta and certified Lipschitz ViTs.
Shared compute: grids (the ViT training grids and stand-ins), study (what the bound studies read)."""
