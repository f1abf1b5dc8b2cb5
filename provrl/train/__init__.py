"""Trainers (RL on LLM policies; SFT) sharing the model forward with the engine."""
