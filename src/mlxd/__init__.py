"""mlxd: local LLM serving daemon on MLX."""
