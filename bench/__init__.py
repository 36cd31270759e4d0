"""Side-by-side benchmarks: mlxd against mlx_lm.server on the same model (`python -m bench`)."""
