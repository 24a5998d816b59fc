"""The rollout: Act and Rehearse unrolling trajectories (the engine), and the method variants that decide who plays
Rehearse."""
