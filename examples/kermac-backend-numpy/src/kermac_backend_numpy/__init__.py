"""An example kermac backend: pairwise programs and their kernel products evaluated with NumPy on the CPU.

A worked third-party plugin for the "Writing a backend" guide, deliberately partial: it runs
pairwise programs (reductions sum, max, min, logsumexp) and their kernel products `K @ v` on float32
and float64 CPU tensors, and refuses everything else -- gradient contractions, half-precision dtypes,
other devices -- with a reason.
Its priority is negative, so `backend="auto"` never picks it: select it with `backend="numpy"`.
"""
