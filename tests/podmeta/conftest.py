"""Fixtures of the pod-metadata tests (defined in podmeta_api.py, next to their helpers)."""

from podmeta_api import api, certs, client, token_file  # noqa: F401 (pytest fixtures)
