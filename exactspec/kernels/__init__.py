"""exactspec's own CPU kernels: int4 weights times a few rows, and attention, each row's bits independent
of how many rows share the pass (README.md in this folder)."""
