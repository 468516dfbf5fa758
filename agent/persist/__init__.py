"""What outlives a process: the checkpoint of intentions, the instance lock, the run directory."""
