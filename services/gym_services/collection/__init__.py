"""Rollout collection: the controller participant that dispatches tasks, appends results and checkpoints its cursor."""
