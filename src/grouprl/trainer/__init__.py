"""Trainers: the only layer that composes rollouts, rewards, models and the math core."""
