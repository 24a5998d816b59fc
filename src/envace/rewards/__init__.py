"""Trajectory rewards: the registry of reward functions and the judge (their agreement with real outcomes is
measured in :mod:`envace.evaluation.agreement`)."""
