"""Your own QA records, your own documents, your own reward — one GRPO step on them.

    python examples/custom_reward.py                  # the tiny random model (seconds)
    python examples/custom_reward.py --policy runs/d1/warmstart/ckpt --k 8

The agent loop scores each episode with ``env.agent.reward`` (exact match or F1). Any other
reward is a function of the finished trajectory — its answer, gold answers, tool calls,
tokens — applied before the trainer sees the group: GRPO's advantages are centred within
each task's k samples, so only the *ranking* of a task's samples matters, not the scale.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from provrl import (
    Collector,
    LocalEngine,
    RLTrainer,
    RunConfig,
    Trajectory,
    build_env,
    load_config,
    load_model,
    read_task_file,
)
from provrl.env import index_collection, token_f1

DOCS = [
    {"id": "m1", "title": "Quillon Bridge", "text": "The Quillon Bridge crosses the Vesh. It opened in 1887."},
    {"id": "m2", "title": "Vesh", "text": "The Vesh is a river of Marrow Province. Its source is Lake Ide."},
]  # fmt: skip
QA = [
    {"id": "r1", "question": "Which river does the Quillon Bridge cross?", "answer": "the Vesh"},
    {"id": "r2", "question": "When did the Quillon Bridge open?", "answer": "1887"},
]


def my_reward(t: Trajectory) -> float:
    """Partial credit: token F1 of the answer, 0.05 off per tool call, −0.5 for no answer."""
    prediction = t.meta["prediction"]
    if prediction is None:
        return -0.5
    return token_f1(prediction, t.meta["answers"]) - 0.05 * t.metrics["num_tool_calls"]


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="tiny", help="model name or checkpoint directory")
    ap.add_argument("--k", type=int, default=4, help="samples per question")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="provrl-reward-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (out / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QA))

    index = index_collection(out / "docs.jsonl")["index"]  # what `provrl index` does
    tasks = read_task_file(out / "qa.jsonl", split="train")  # plain {question, answer} records
    cfg = load_config(
        RunConfig,
        overrides=[f"env.search.index={index}", "env.agent.max_turns=3", "rl.lr=1e-4"],
    )
    lm = load_model(args.policy)
    engine = LocalEngine(lm, cfg.engine.model_copy(update={"max_seqs": 8, "max_context": 2048}))
    env = build_env(engine, lm, None, cfg.env)  # type: ignore[arg-type]  # no world: own index
    with Collector(env, concurrency=8, seed=0) as collector:
        groups = list(collector.run(tasks, args.k))
    engine.close()

    trajectories = [t for g in groups for t in g.trajectories]
    before = [t.reward for t in trajectories]
    for t in trajectories:
        t.reward = my_reward(t)  # replaces the loop's exact-match score
    pad = lm.tokenizer.pad_token_id
    trainer = RLTrainer(lm.model, cfg.rl, pad_token_id=pad if pad is not None else 0)
    result = trainer.step(trajectories)
    summary = {
        "questions": len(groups),
        "samples": len(trajectories),
        "mean_builtin_reward": sum(r or 0.0 for r in before) / len(before),
        "mean_my_reward": sum(t.reward or 0.0 for t in trajectories) / len(trajectories),
        "new_version": result.version,
        "loss": result.metrics.get("loss", float("nan")),
    }
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
