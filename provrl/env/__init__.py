"""Search-agent environment: synthetic world, tasks, search backends, agent loop, rewards.

``from provrl.env import AgentEnv, run_episode, read_task_file, EnvConfig`` — see
docs/env.md. Names load on first use (the agent loop imports the tokenizer stack).
"""

from provrl._lazy import lazy_exports

_EXPORTS = {
    # configuration
    "EnvConfig": "provrl.env.config",
    "WorldConfig": "provrl.env.config",
    "SearchConfig": "provrl.env.config",
    "AgentConfig": "provrl.env.config",
    "EvalConfig": "provrl.env.config",
    # the world and its tasks
    "build_world": "provrl.env.build",
    "ensure_world": "provrl.env.build",
    "load_split": "provrl.env.build",
    "Task": "provrl.env.tasks",
    "TaskFileError": "provrl.env.tasks",
    "read_task_file": "provrl.env.tasks",
    "save_tasks": "provrl.env.tasks",
    # search
    "SearchBackend": "provrl.env.search",
    "SearchError": "provrl.env.search",
    "Hit": "provrl.env.search",
    "SqliteSearch": "provrl.env.sqlite_index",
    "HttpSearch": "provrl.env.http_search",
    "index_collection": "provrl.env.collection",
    # the agent loop and its reward
    "AgentEnv": "provrl.env.agent",
    "EpisodeCounts": "provrl.env.agent",
    "run_episode": "provrl.env.agent",
    "tools_identity": "provrl.env.agent",
    "reward": "provrl.env.rewards",
    "exact_match": "provrl.env.rewards",
    "token_f1": "provrl.env.rewards",
    # evaluation
    "evaluate": "provrl.env.evaluate",
    "search_backend": "provrl.env.evaluate",
    "pass_at_k": "provrl.env.evaluate",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
