"""mlxd.supervisor.store: model files on disk as Ollama's API manages them."""
