"""The RL fault drill: the RLlib example, faults of RL post-training, the `rl` alerts (make rl-drill)."""
