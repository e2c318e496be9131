"""Pure torch kernels: no I/O, device/dtype follow the inputs, batched over leading dims.

Import the submodules (`harness.kernels.attention`, `.krylov`, `.power`, ...) directly: this package re-exports
nothing, so an experiment's code hash (harness.store.codehash) covers only the kernels it actually imports (a
Lanczos edit does not re-key the trained ViTs, whose closure reaches `attention` only).
"""
