"""The web dashboard: static files served at /ui (and at / for browsers)."""
