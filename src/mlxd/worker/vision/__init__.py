"""Images in: a vision-language model's vision tower beside mlx-lm's text model (issue #35)."""
