"""Example perfbalance policy package (see policy.py)."""
