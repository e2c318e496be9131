"""Everything that is written to and read back from disk, in safe formats only.

- atomic.py    canonical JSON, sha256, atomic writes (tmp + fsync + os.replace), stale temp cleanup, permissions
- codehash.py  what a cell's numbers depend on: the compute part of an experiment module (AST, presentation
               methods excluded) and the static import closure of the harness/experiments modules it uses
- keys.py      cell keys and the environment fingerprint (library versions that change numbers)
- cells.py     verified JSON cell files (checksum, key), CorruptCell
- claims.py    per-cell claims so concurrent runners split the work (stale claims are taken over)
- artifacts.py trained models and other tensors: torch.save, loaded with weights_only=True (no code runs)
"""
