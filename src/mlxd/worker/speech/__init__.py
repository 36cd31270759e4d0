"""mlxd.worker.speech: speech-to-text models (Whisper through mlx-audio): loading, the one
thread that runs them, and the response formats."""
