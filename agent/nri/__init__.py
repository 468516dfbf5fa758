"""The runtime route: perfbalance as an NRI plugin of containerd / CRI-O (docs/nri.md)."""
