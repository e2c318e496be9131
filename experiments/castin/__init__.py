"""How Smooth Is Attention? (Castin, Ablin, Peyre, ICML 2024): sqrt(n) growth on real and adversarial inputs,
the radius regimes, masked attention, gamma, magnitude and mass splitting. Shared compute: common (layer inputs,
weights), llama (the RoPE / GQA panels), paper (the pretrained-weights stand-ins)."""
