"""A reward function named by import path in tests (``env.agent.rewards``)."""


def one_per_turn(completions, **kwargs):
    """One point per assistant turn (TRL's signature)."""
    return [float(sum(m["role"] == "assistant" for m in c)) for c in completions]
