"""Measurement: real-environment trials, test-time rehearsal, budgets, fidelity, the experiment, its report, and export
of trajectories."""
