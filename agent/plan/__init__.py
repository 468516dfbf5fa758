"""Running the selected policy on a Snapshot: its state, a time budget, isolation."""
