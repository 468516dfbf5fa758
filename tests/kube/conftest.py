"""Fixtures of the control-plane status tests (the API stand-in lives in kube_api.py)."""

from kube_api import kube, kube_certs  # noqa: F401 (pytest fixtures)
