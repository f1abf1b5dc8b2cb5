"""TRL's GRPOTrainer, on a search agent: your QA file, your documents, two reward functions.

    python examples/grpo_trainer.py          # the tiny random model, from the repository root

The code below is README's "From Python" example, line for line (tests/test_examples.py
checks that the two match and runs this file).
"""

# --- README: From Python ---
from provrl import GRPOConfig, GRPOTrainer


def correct(completions, answer, **kwargs):  # TRL's signature; `answer` is the dataset's column
    """1 when the episode's last turn names the gold answer."""
    return [
        float(a.lower() in c[-1]["content"].lower())
        for c, a in zip(completions, answer, strict=True)
    ]


def concise(completions, **kwargs):
    """A small cost per message (turns and tool results): search when it helps, then answer."""
    return [-0.05 * len(c) for c in completions]


args = GRPOConfig(output_dir="runs/grpo-demo", preset="quick", max_steps=2, num_generations=4,
                  learning_rate=1e-4, reward_weights=[1.0, 1.0, 0.2])  # fmt: skip
trainer = GRPOTrainer(
    model="tiny",  # or "smollm2-135m", or a checkpoint directory
    reward_funcs=[correct, concise, "format"],  # callables, or built-ins: em, f1, format
    args=args,
    train_dataset="examples/data/qa.jsonl",  # {"question", "answer"} per line
    tools="examples/data/docs.jsonl",  # documents to search (indexed here), or a /retrieve URL
)
print(trainer.train()["rl"]["checkpoint"])  # the trained policy: an HF checkpoint directory
# --- end ---
