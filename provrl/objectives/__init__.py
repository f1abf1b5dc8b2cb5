"""Pure tensor functions: advantages, IS corrections, policy losses, KL estimators, TRPO."""
