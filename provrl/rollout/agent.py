"""The multi-turn agent loop: generate ⇄ search, token ids in, token ids out.

One episode on one engine request::

    prompt ids  = chat template(instructions, worked examples, question)      non-action
    turn 0      = engine.submit(prompt ids)            → sampled ids           action
    repeat:
        parse the turn's text (tag or Hermes protocol; never raises)
        answer            → stop
        search / open     → run the tool (timeout, latency recorded)
        malformed         → error observation, counter (``max_malformed`` in a row: stop)
        observation ids   = close the assistant turn, a user/tool turn with the
                            (truncated) result, reopen the assistant turn          non-action
        turn t+1          = engine.submit_continue(request, observation ids)      action
    until an answer, max_turns, or the token budget; then release the request.

The trajectory holds exactly the ids the engine consumed and produced, in order: earlier
turns are never re-tokenized (the observation is tokenized once, on its own). Sampled ids
carry the engine's stamps (version, logprob, kept mass, KV versions, replica).

The oracle's dialogues become trajectories too (:func:`oracle_trajectory`): a deterministic
policy, so each of its tokens has q(a|h) = 1, i.e. logprob 0, version 0 — teacher traces
for SFT whose action mask is exactly the tokens to imitate.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from provrl.engine.api import Engine, EngineError, TurnOutput
from provrl.env.config import AgentConfig, SearchConfig
from provrl.env.oracle import OracleResult
from provrl.env.prompts import (
    Message,
    Prompt,
    build_messages,
    format_document,
    format_error,
    format_hits,
    format_repeat,
)
from provrl.env.protocol import Call, Malformed, parse, stop_strings
from provrl.env.rewards import (
    Episode,
    RewardSum,
    call_cost_at,
    contains_answer,
    exact_match,
    reward,
    reward_sum,
    token_f1,
)
from provrl.env.search import QueryError, SearchBackend, SearchError
from provrl.env.tasks import PLAIN_KIND, Task
from provrl.models.chat import chat_ids, continuation_ids, stop_token_ids, tokenizer_identity
from provrl.provenance import Identity, SamplingParams, ToolCall, Trajectory, TrajectoryBuilder
from provrl.rollout.failures import hop_metrics


@dataclass
class AgentEnv:
    """Everything an episode needs besides the task (shared by concurrent loops)."""

    engine: Engine
    tokenizer: Any
    backend: SearchBackend
    agent: AgentConfig
    search: SearchConfig
    policy: Identity
    tools: Identity
    shots: Sequence[Sequence[Message]] = ()
    codec: ObservationCodec = field(init=False)
    prompt: Callable[[str, bool], tuple[int, ...]] = field(init=False, repr=False)
    """(question, world wording: :func:`world_wording`) → prompt ids (:func:`prompt_ids`),
    cached: the k samples of a task share one prompt, which with worked examples is thousands
    of tokens to render and tokenize."""
    rewards: RewardSum | None = field(init=False, repr=False)
    """``agent.rewards`` resolved (:func:`~provrl.env.rewards.reward_sum`); None: the
    outcome formula of :func:`~provrl.env.rewards.reward`."""

    def __post_init__(self) -> None:
        self.codec = ObservationCodec(self.tokenizer, self.agent)
        a = self.agent
        self.rewards = (
            reward_sum(a.rewards, a.reward_weights, outcome_reward(a)) if a.rewards else None
        )
        instructions = {w: self.agent.instructions(world=w) for w in (True, False)}
        self.prompt = functools.lru_cache(maxsize=256)(
            lambda q, world: tuple(
                prompt_ids(self.tokenizer, q, self.agent.protocol, self.shots, instructions[world])
            )
        )


def world_wording(task: Task, search: SearchConfig) -> bool:
    """Whether ``env.agent.prompt: auto`` speaks of the built-in world: on its tasks and its
    index, not on a plain question/answer task or your own index."""
    return task.kind != PLAIN_KIND and not search.index


def outcome_reward(a: AgentConfig) -> Callable[[Episode], float]:
    """env.agent's own formula (:func:`~provrl.env.rewards.reward`) as a reward function:
    the built-in ``outcome``."""

    def outcome(e: Episode) -> float:
        return reward(
            e.prediction,
            e.task.answers,
            kind=a.reward,
            format_ok=e.format_ok,
            format_penalty=a.format_penalty,
            tool_calls=e.tool_calls,
            tool_call_cost=a.tool_call_cost,
        )

    return outcome


def prompt_ids(
    tokenizer: Any,
    question: str,
    protocol: str,
    shots: Sequence[Sequence[Message]] = (),
    prompt: Prompt | None = None,
) -> list[int]:
    """The episode's prompt: instructions (``prompt``, the world's by default), worked
    examples and the question, as chat ids with the assistant turn opened."""
    return chat_ids(
        tokenizer, build_messages(question, protocol, shots, prompt), add_generation_prompt=True
    )


LATENCY_ADDED = ("time_scale",)
"""``env.search.latency`` fields added after tool fingerprints were first recorded."""


def dump_since(section: BaseModel, added: Sequence[str]) -> dict[str, Any]:
    """``section`` as a dict for an identity, without the ``added`` fields that are at their
    default: a field added later leaves every earlier fingerprint as it was until it is set."""
    fields = type(section).model_fields
    return section.model_dump(
        exclude={f for f in added if getattr(section, f) == fields[f].default}
    )


def tools_identity(backend: SearchBackend, search: SearchConfig, agent: AgentConfig) -> Identity:
    """Identity of the tool configuration: index fingerprint + every setting that changes
    what the model sees."""
    config = {
        "backend": backend.name,
        "k": search.k,
        "snippet_words": search.snippet_words,
        "open_words": search.open_words,
        "title_weight": search.title_weight,
        "latency": dump_since(search.latency, LATENCY_ADDED),
        "protocol": agent.protocol,
        "max_observation_tokens": agent.max_observation_tokens,
        "tool_timeout_s": agent.tool_timeout_s,
    }
    if (agent.prompt, agent.prompt_file, agent.prompt_template, agent.reasoning) != ("auto", "", "", False):  # fmt: skip
        # not the default prompt: named here (the default's absence keeps earlier fingerprints)
        world, own = agent.instructions(world=True), agent.instructions(world=False)
        text = json.dumps([world.system, world.user, own.system, own.user])
        name = "file" if agent.prompt_file else "text" if agent.prompt_template else agent.prompt
        config["prompt"] = {
            "name": name,
            "reasoning": agent.reasoning,
            "sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
        }
    h = hashlib.sha256((backend.fingerprint() + json.dumps(config, sort_keys=True)).encode())
    return Identity(backend.name, "sha256:" + h.hexdigest()[:32], config)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed hashed from ``parts`` (per turn here; per (task, sample) in eval)."""
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


class ObservationCodec:
    """Turns a tool result into the non-action ids appended between two agent turns."""

    def __init__(self, tokenizer: Any, agent: AgentConfig) -> None:
        self.tokenizer, self.agent = tokenizer, agent
        self.stop_ids = frozenset(stop_token_ids(tokenizer))

    def ids(self, text: str, turn_ids: Sequence[int]) -> tuple[list[int], bool]:
        """Ids that end the model's turn (the chat template's closing, e.g. ``<|im_end|>\n``,
        minus the stop token the turn already ended with), carry ``text`` in a user/tool turn
        and reopen the assistant turn, as the tokenizer's own chat template writes them;
        ``text`` is cut to ``max_observation_tokens`` first. Returns (ids, whether it was
        cut)."""
        tok, cap = self.tokenizer, self.agent.max_observation_tokens
        body = tok.encode(text, add_special_tokens=False)
        truncated = len(body) > cap
        if truncated:
            text = tok.decode(body[: cap - 2], skip_special_tokens=True) + " …"
        ended = bool(turn_ids) and int(turn_ids[-1]) in self.stop_ids
        ids = continuation_ids(tok, self.agent.observation_role, text, close_assistant=not ended)
        return ids, truncated


def _params(env: AgentEnv, max_new: int, seed: int) -> SamplingParams:
    a = env.agent
    return SamplingParams(
        temperature=a.temperature,
        top_p=a.top_p,
        top_k=a.top_k,
        max_new_tokens=max_new,
        stop=stop_strings(a.protocol),
        seed=seed,
    )


CALL_LIMIT = "tool call limit"
"""The error of a well-formed call refused for ``max_tool_calls`` (not a tool failure)."""
REPEATED = "repeated call"
"""The error of a call not run under ``env.agent.repeat_calls: note``: the episode already ran
it (not a tool failure)."""
QUERY_REFUSED = "query refused"
"""How the error of a call the tool refused for the query's own bounds begins
(:class:`~provrl.env.search.QueryError`: too long, too many terms): the policy's fault, not
a tool failure."""


def tool_ran(call: ToolCall) -> bool:
    """A search or open call that reached the tool (not refused for the call limit, not a
    repeat left unrun)."""
    return call.name in ("search", "open") and call.error not in (CALL_LIMIT, REPEATED)


def tool_failed(call: ToolCall) -> bool:
    """A call the tool failed on: timed out, service down, bad answer (not a refused query)."""
    return tool_ran(call) and not call.ok and not (call.error or "").startswith(QUERY_REFUSED)


def tool_failures(trajs: Iterable[Trajectory]) -> dict[str, Any]:
    """Search and open calls the tool failed on (timed out, service down, bad answer: the
    agent saw an error observation), against the calls run: ``tool_calls_run``,
    ``tool_errors`` and ``tool_error_rate`` = errors / calls (0 with no call). Malformed calls
    and calls refused for the call limit never reached the tool and are not counted; a
    query the tool refused for its own bounds (:data:`QUERY_REFUSED`) counts as run, not
    failed."""
    run = errors = 0
    for t in trajs:
        for c in t.tool_calls:
            if tool_ran(c):
                run += 1
                errors += tool_failed(c)
    rate = errors / run if run else 0.0
    return {"tool_calls_run": run, "tool_errors": errors, "tool_error_rate": rate}


def call_key(name: str, argument: str) -> tuple[str, str]:
    """What makes two calls the same call: the tool and its argument up to case and spacing
    (the search backends match case-insensitively, so these return the same results)."""
    return name, " ".join(argument.casefold().split())


def repeat_count(calls: Iterable[ToolCall]) -> int:
    """Search/open calls identical (:func:`call_key`) to an earlier one the tool ran
    successfully, run again or not (``env.agent.repeat_calls``); calls refused for the call
    limit never count: the episode's ``num_repeat_calls``, read from its calls rather than
    counted beside them."""
    ran: set[tuple[str, str]] = set()
    n = 0
    for c in calls:
        if c.name not in ("search", "open") or c.error == CALL_LIMIT:
            continue
        key = call_key(c.name, c.arguments)
        if key in ran:
            n += 1
        elif c.ok:
            ran.add(key)
    return n


def calls_after_answer(results: Sequence[str | None], answers: Iterable[str]) -> int:
    """Search/open calls made after a tool result shown to the model already held a gold
    answer (:func:`provrl.env.rewards.contains_answer`), with ``results[i]`` what the i-th
    call showed (None: nothing, e.g. a noted repeat): the calls the episode did not need,

        n_after = n − (i* + 1),   i* = the first i whose result holds an answer (0 if none),

    what ``env.agent.tool_call_cost_on: after_answer`` charges."""
    answers = list(answers)
    for i, text in enumerate(results):
        if text is not None and contains_answer(text, answers):
            return len(results) - i - 1
    return 0


def run_tool(env: AgentEnv, call: Call) -> tuple[str, ToolCall]:
    """Execute a search/open call; failures become error observations, never exceptions."""
    t0 = time.perf_counter()
    try:
        if call.name == "search":
            obs = format_hits(env.backend.search(call.argument, env.search.k))
        else:
            obs = format_document(call.argument, env.backend.open(call.argument))
        ok, err = True, None
    except TimeoutError as e:
        obs, ok, err = format_error(f"{call.name} timed out"), False, str(e)
    except QueryError as e:  # the query is out of the tool's bounds: the policy's doing
        obs, ok, err = format_error(f"{call.name} failed"), False, f"{QUERY_REFUSED}: {e}"
    except (SearchError, OSError, ValueError) as e:
        obs, ok, err = format_error(f"{call.name} failed"), False, str(e)
    return obs, ToolCall(0, call.name, call.argument, ok, err, time.perf_counter() - t0)


@dataclass
class EpisodeCounts:
    """What one episode counted while it ran (the trajectory's metrics are made from it)."""

    turns: int = 0
    """Assistant turns the engine sampled."""
    searches: int = 0
    opens: int = 0
    malformed: int = 0
    """Turns the protocol parser could not read as a call (in total)."""
    streak: int = 0
    """Malformed turns in a row (``max_malformed`` of them end the episode)."""
    truncated_obs: int = 0
    """Tool results cut to ``max_observation_tokens``."""
    ran: set[tuple[str, str]] = field(default_factory=set)
    """The calls the tool ran successfully, by :func:`call_key` (what a repeat repeats)."""
    results: list[str | None] = field(default_factory=list)
    """What each search/open call showed the model (None: a noted repeat, no results), in
    order: :func:`calls_after_answer` reads it."""
    t_gen: float = 0.0
    """Seconds waiting for the engine."""
    t_tools: float = 0.0
    """Seconds in tool calls."""

    @property
    def tool_calls(self) -> int:
        return self.searches + self.opens


def run_episode(
    env: AgentEnv,
    task: Task,
    *,
    traj_id: str,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
) -> Trajectory:
    """Roll out one episode of ``task`` on ``env.engine`` and return its trajectory
    (``meta`` is merged into the trajectory's ``meta``, e.g. its GRPO group)."""
    a, tok = env.agent, env.tokenizer
    t_start = time.perf_counter()
    prompt = env.prompt(task.question, world_wording(task, env.search))
    budget = a.max_total_tokens
    if len(prompt) + 8 > budget:
        raise ValueError(
            f"task {task.task_id}: prompt has {len(prompt)} tokens; max_total_tokens={budget} "
            "leaves no room (fewer --shots or a larger budget)"
        )
    b = TrajectoryBuilder(traj_id, task.task_id)
    b.add_prompt(prompt)
    n = EpisodeCounts()
    answer: str | None = None
    finish = "max_turns"
    turn = 0
    max_new = min(a.max_new_tokens, budget - len(prompt))
    scored = env.rewards is not None  # reward functions read the turns as messages
    completion: list[Message] = []
    completion_ids: list[int] = []
    t0 = time.perf_counter()
    fut = env.engine.submit(prompt, _params(env, max_new, derive_seed(seed, 0)), request_id=traj_id)
    try:
        while True:
            out: TurnOutput = fut.result()
            n.t_gen += time.perf_counter() - t0
            if out.finish_reason in ("error", "cancelled"):  # the engine gave up on the turn
                finish = f"engine_{out.finish_reason}"
                break
            n.turns += 1
            b.add_sampled(out)
            text = tok.decode(out.token_ids, skip_special_tokens=False)
            if scored:
                content = tok.decode(out.token_ids, skip_special_tokens=True)
                completion.append({"role": "assistant", "content": content})
                completion_ids.extend(int(i) for i in out.token_ids)
            parsed = parse(text, a.protocol)
            if isinstance(parsed, Call) and parsed.name == "answer":  # done: score it below
                answer = parsed.argument
                b.add_tool_call(ToolCall(turn, "answer", parsed.argument))
                finish = "answer"
                break
            n.streak = n.streak + 1 if isinstance(parsed, Malformed) else 0
            ran_tool = False  # this turn's observation is a tool's result (n.results[-1])
            if isinstance(parsed, Malformed):  # tell the model what was wrong, or give up
                n.malformed += 1
                b.add_tool_call(ToolCall(turn, "invalid", parsed.raw, False, parsed.error))
                if n.streak >= a.max_malformed:
                    finish = "malformed"
                    break
                obs = format_error(parsed.error)
            elif n.tool_calls >= a.max_tool_calls:  # a well-formed call over the limit
                b.add_tool_call(ToolCall(turn, parsed.name, parsed.argument, False, CALL_LIMIT))
                obs = format_error("tool call limit reached: give your <answer> now")
            else:  # search / open: run the tool (failures become error observations)
                key = call_key(parsed.name, parsed.argument)
                n.searches += parsed.name == "search"
                n.opens += parsed.name == "open"
                if key in n.ran and a.repeat_calls == "note":  # not run: say where it is
                    obs = format_repeat(parsed.name, parsed.argument)
                    n.results.append(None)
                    b.add_tool_call(ToolCall(turn, parsed.name, parsed.argument, False, REPEATED))
                else:
                    obs, call = run_tool(env, parsed)
                    n.t_tools += call.latency_s
                    if call.ok:
                        n.ran.add(key)
                    n.results.append(obs)
                    ran_tool = True
                    b.add_tool_call(
                        ToolCall(
                            turn, call.name, call.arguments, call.ok, call.error, call.latency_s
                        )
                    )
            turn += 1
            if turn >= a.max_turns:
                finish = "max_turns"
                break
            # the observation as non-action ids; stop if the next turn would have < 8 tokens
            obs_ids, cut = env.codec.ids(obs, out.token_ids)
            n.truncated_obs += cut
            if cut and ran_tool:  # the model sees what is left of the result
                n.results[-1] = tok.decode(obs_ids, skip_special_tokens=True)
            room = budget - len(b) - len(obs_ids)
            if room < 8:
                finish = "token_budget"
                break
            b.next_turn()
            b.add_observation(obs_ids)
            if scored:
                completion.append({"role": a.observation_role, "content": obs})
                completion_ids.extend(obs_ids)
            t0 = time.perf_counter()
            fut = env.engine.submit_continue(
                traj_id, obs_ids, _params(env, min(a.max_new_tokens, room), derive_seed(seed, turn))
            )
    except EngineError as e:  # the engine refused a request (e.g. the context is full)
        finish = f"engine_rejected: {e}"
    finally:
        with contextlib.suppress(EngineError):
            env.engine.release(traj_id)
    format_ok = answer is not None and n.malformed == 0
    after = calls_after_answer(n.results, task.answers)
    metrics = _metrics(
        task,
        b,
        answer,
        searches=n.searches,
        opens=n.opens,
        malformed=n.malformed,
        turns=n.turns,
        truncated=n.truncated_obs,
        repeats=repeat_count(b.tool_calls),
        after_answer=after,
    )
    metrics.update(hop_metrics(n.results, [h.reveals for h in task.oracle], task.answers))
    if env.rewards is None:
        cost = call_cost_at(a.tool_call_cost, a.tool_call_cost_warmup, b.first_action_version or 0)
        charged = n.tool_calls if a.tool_call_cost_on == "all" else after
        score = reward(
            answer,
            task.answers,
            kind=a.reward,
            format_ok=format_ok,
            format_penalty=a.format_penalty,
            tool_calls=charged,
            tool_call_cost=cost,
        )
        if a.tool_call_cost_warmup:
            metrics["tool_call_cost"] = cost
    else:  # the weighted sum of env.agent.rewards, each function's score in the metrics
        episode = Episode(
            task,
            answer,
            build_messages(task.question, a.protocol, env.shots),
            completion or [{"role": "assistant", "content": ""}],
            completion_ids,
            format_ok,
            n.tool_calls,
        )
        score, parts = env.rewards(episode)
        metrics.update(parts)
    traj = b.build(
        reward=score,
        metrics=metrics,
        timings={
            "generation": n.t_gen,
            "tools": n.t_tools,
            "total": time.perf_counter() - t_start,
        },
        sampling=_params(env, a.max_new_tokens, seed),
        policy=env.policy,
        tools=env.tools,
        meta={**_meta(task, answer, finish), "seed": seed, **(meta or {})},
    )
    return traj


# ----------------------------------------------------------------------------- oracle
def oracle_trajectory(
    task: Task,
    result: OracleResult,
    tokenizer: Any,
    agent: AgentConfig,
    tools: Identity,
    *,
    traj_id: str,
    shots: Sequence[Sequence[Message]] = (),
) -> Trajectory:
    """The oracle's dialogue as a trajectory (teacher trace): its turns are actions of a
    deterministic policy (logprob 0, version 0, kept mass 1), everything else non-action,
    assembled exactly as :func:`run_episode` assembles a model's episode."""
    b = TrajectoryBuilder(traj_id, task.task_id)
    instructions = agent.instructions(world=task.kind != PLAIN_KIND)
    b.add_prompt(prompt_ids(tokenizer, task.question, agent.protocol, shots, instructions))
    codec = ObservationCodec(tokenizer, agent)
    cut = 0
    for action, obs in result.turns:
        ids = tokenizer.encode(action, add_special_tokens=False)
        n = len(ids)
        b.add_actions(
            ids, logprob=[0.0] * n, kept_mass=[1.0] * n, version=0, kv_min=0, kv_max=0, replica=0
        )
        if obs is None:
            break
        obs_ids, was_cut = codec.ids(obs, ids)
        cut += was_cut
        b.next_turn()
        b.add_observation(obs_ids)
    calls = result.calls or [("search", st.query) for st in task.oracle]
    for j, (name, arg) in enumerate(calls):
        b.add_tool_call(ToolCall(j, name, arg, True, None, result.latencies[j]))
    b.add_tool_call(ToolCall(len(calls), "answer", result.answer))
    opens = sum(name == "open" for name, _ in calls)
    shown = [obs for _, obs in result.turns[: len(calls)]]  # what each call showed
    return b.build(
        reward=exact_match(result.answer, task.answers),
        metrics=_metrics(
            task,
            b,
            result.answer,
            searches=result.searches,
            opens=opens,
            malformed=0,
            turns=len(result.turns),
            truncated=cut,
            after_answer=calls_after_answer(shown, task.answers),
            answered=result.solved,
        ),
        timings={"tools": sum(result.latencies)},
        sampling=SamplingParams(temperature=0.0),
        policy=Identity(
            result.teacher,
            f"{result.teacher}-v1",
            {
                "deterministic": result.teacher == "oracle",
                "tokenizer": tokenizer_identity(tokenizer),
            },
        ),
        tools=tools,
        meta={
            **_meta(task, result.answer, "answer" if result.solved else "oracle_failed"),
            "problems": result.problems,
        },
    )


# ----------------------------------------------------------------------------- summaries
def _metrics(
    task: Task,
    b: TrajectoryBuilder,
    answer: str | None,
    *,
    searches: int,
    opens: int,
    malformed: int,
    turns: int,
    truncated: int,
    repeats: int = 0,
    after_answer: int = 0,
    answered: bool | None = None,
) -> dict[str, float]:
    """The per-trajectory metrics shared by model episodes and oracle traces."""
    return {
        "exact_match": exact_match(answer, task.answers),
        "f1": token_f1(answer, task.answers),
        "num_tool_calls": float(searches + opens),
        "num_searches": float(searches),
        "num_opens": float(opens),
        "num_tokens": float(len(b)),
        "num_action_tokens": float(b.num_actions),
        "malformed_calls": float(malformed),
        "turns": float(turns),
        "answered": float(answer is not None if answered is None else answered),
        "truncated_observations": float(truncated),
        "num_repeat_calls": float(repeats),
        "calls_after_answer": float(after_answer),
        "min_searches": float(task.min_searches),
        "tier": float(task.tier),
    }


def _meta(task: Task, prediction: str | None, finish: str) -> dict[str, Any]:
    return {
        "question": task.question,
        "prediction": prediction,
        "answers": task.answers,
        "tier": task.tier,
        "kind": task.kind,
        "split": task.split,
        "finish": finish,
    }
