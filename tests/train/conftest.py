"""Real trajectories from the tiny Llama for the trainer tests.

``sample_group`` is a plain ancestral sampler (one full forward per token — the tiny model
makes that cheap) that records exactly what the engine records: log q(a_t|h_t) of the
distribution it sampled from (after temperature, top-k, top-p, renormalised), the kept mass,
and the version of the weights it used. It builds provenance Trajectories with the real
TrajectoryBuilder; nothing in the trainer is replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch

from provrl.models import chat_ids
from provrl.provenance import SamplingParams, Trajectory, TrajectoryBuilder


@torch.no_grad()
def sample_tokens(
    model,
    x: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Continue each row of ``x`` ``[n, L]`` by ``max_new_tokens`` sampled tokens. Returns,
    per new position, the sampled ids ``[n]``, their log q after temperature / top-k / top-p
    (renormalised, float64) and the kept mass."""
    toks, logq, kept = [], [], []
    for _ in range(max_new_tokens):
        z = model(input_ids=x, logits_to_keep=1).logits[:, -1].double() / temperature
        p = torch.softmax(z, -1)
        ps, idx = torch.sort(p, -1, descending=True)
        rank = torch.arange(p.shape[-1])
        in_k = rank < (top_k if top_k > 0 else p.shape[-1])
        head = torch.where(in_k, ps, 0.0)
        before = torch.cumsum(head, -1) - head
        keep_sorted = in_k & (before < top_p * head.sum(-1, keepdim=True))
        keep_sorted[:, 0] = True
        keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
        m = torch.where(keep, p, 0.0).sum(-1)
        q = torch.where(keep, p, 0.0) / m[:, None]
        a = torch.multinomial(q, 1, generator=generator).squeeze(-1)
        toks.append(a)
        logq.append(q.gather(-1, a[:, None]).squeeze(-1).log())
        kept.append(m)
        x = torch.cat([x, a[:, None]], 1)
    return toks, logq, kept


@torch.no_grad()
def sample_group(
    model,
    prompt_ids: Sequence[int],
    *,
    task_id: str,
    n: int,
    max_new_tokens: int,
    reward: Callable[[np.ndarray], float],
    version: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    x = torch.tensor([list(prompt_ids)] * n)
    toks, logq, kept = sample_tokens(
        model, x, max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, generator=g
    )
    out = []
    params = SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens
    )
    for i in range(n):
        b = TrajectoryBuilder(f"{task_id}-{i}", task_id, sampling=params)
        b.add_prompt(list(prompt_ids))
        actions = np.array([int(t[i]) for t in toks])
        b.add_actions(
            actions,
            logprob=[float(lq[i]) for lq in logq],
            kept_mass=[min(1.0, float(k[i])) for k in kept],
            version=version,
            kv_min=version,
            kv_max=version,
            replica=0,
        )
        out.append(b.build(reward=float(reward(actions))))
    return out


def even_fraction(actions: np.ndarray) -> float:
    """Toy reward: the fraction of generated token ids that are even."""
    return float((actions % 2 == 0).mean())


@pytest.fixture(scope="session")
def prompts(tiny):
    questions = ["What is two plus two?", "Name a colour.", "Say hello."]
    return [
        (f"task{i}", chat_ids(tiny.tokenizer, [{"role": "user", "content": q}]))
        for i, q in enumerate(questions)
    ]


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    """The tiny model's ops are too small to gain from intra-op threads; on a shared 2-core
    machine the thread pool's spin-waiting made these tests several times slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
