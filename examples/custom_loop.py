"""A GRPO loop you can read top to bottom: model → engine → groups → trainer → hot-load.

    python examples/custom_loop.py                     # tiny random model, quick world
    python examples/custom_loop.py --config default --steps 20 --set rl.lr=1e-6

Every action token of every trajectory records the policy version that sampled it and its
exact behaviour log-probability; the trainer corrects with them, so the same loop stays
exact when rollouts and training overlap. ``provrl run`` is this job with a warm start,
probe-and-filter, resumable checkpoints and asynchronous hot-load
(provrl/pipeline/rl_loop.py); this file is the loop without them.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from provrl import (
    Collector,
    LocalEngine,
    MetricsWriter,
    RLTrainer,
    RunConfig,
    TrajectoryWriter,
    build_env,
    ensure_world,
    load_config,
    load_model,
    load_split,
)


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="quick", help="preset in configs/ or a YAML path")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="key=value")
    ap.add_argument("--steps", type=int, default=2, help="RL steps (= new policy versions)")
    ap.add_argument("--groups", type=int, default=2, help="tasks per step (GRPO groups)")
    ap.add_argument("--k", type=int, default=4, help="samples per task (group size)")
    ap.add_argument("--world", type=Path, default=None, help="world dir (default: the config's)")
    ap.add_argument("--out", type=Path, default=None, help="run dir (default: a temp dir)")
    args = ap.parse_args(argv)
    cfg = load_config(RunConfig, args.config, args.overrides)
    out = args.out or Path(tempfile.mkdtemp(prefix="provrl-loop-"))

    # 1. tasks: the search world's train split (generated once and cached), easiest tier
    world = args.world or ensure_world(cfg.env.world)
    tasks = [t for t in load_split(world, "train") if t.tier == 1]

    # 2. the policy, and a rollout engine on its own copy of the weights (version 0)
    lm = load_model(
        cfg.model.name, dtype=cfg.model.dtype, device=cfg.model.device, seed=cfg.model.seed
    )
    engine = LocalEngine(lm, cfg.engine.model_copy(update={"seed": cfg.seed}))
    env = build_env(engine, lm, world, cfg.env)  # search tool, prompt, policy identity

    # 3. the learner: GRPO advantages + the configured off-policy correction + AdamW
    pad = lm.tokenizer.pad_token_id
    metrics = MetricsWriter(out, tensorboard=False)
    trainer = RLTrainer(
        lm.model,
        cfg.rl,
        pad_token_id=pad if pad is not None else 0,
        metrics=metrics,
        tokenizer=lm.tokenizer_identity,
    )

    history = []
    with (
        TrajectoryWriter(out / "trajectories.jsonl") as log,
        Collector(env, concurrency=args.groups * args.k, seed=cfg.seed, writer=log) as collector,
    ):
        for step in range(args.steps):
            # 4. roll out: k samples of each task, agent loops running concurrently
            batch = [tasks[(step * args.groups + i) % len(tasks)] for i in range(args.groups)]
            groups = list(collector.run(batch, args.k, round=step))
            trajectories = [t for g in groups for t in g.trajectories]
            # strict on-policy here: every action token comes from the weights being trained
            assert all((t.version[t.is_action] == trainer.version).all() for t in trajectories)

            # 5. one update; the trainer returns the new weights as version v+1
            result = trainer.step(trajectories)

            # 6. hot-load them: "drain" finishes in-flight turns first and resets the caches
            #    (the async loop uses "keep": in-flight requests continue under v+1)
            engine.load_weights(result.state_dict, result.version, mode="drain")

            row = {
                "step": step,
                "version": result.version,
                "reward": sum(sum(g.rewards) for g in groups) / len(trajectories),
                "loss": result.metrics.get("loss", float("nan")),
                "action_tokens": result.metrics["num_action_tokens"],
            }
            history.append(row)
            print(json.dumps(row))
    engine.close()
    metrics.close()
    print(f"trajectories (per-token provenance): {out / 'trajectories.jsonl'}")
    return history


if __name__ == "__main__":
    main()
