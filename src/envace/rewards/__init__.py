"""Trajectory rewards (the registry of reward functions and the judge) and their agreement with real outcomes."""
