"""The search agent's world: synthetic world, tasks, search backends, tool protocol, rewards.

``from provrl.env import ensure_world, read_task_file, search_backend, reward, EnvConfig`` —
see docs/env.md. The agent loop that acts in this world, and evaluation, are
:mod:`provrl.rollout`. Names load on first use.
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
    "search_backend": "provrl.env.build",
    # rewards
    "reward": "provrl.env.rewards",
    "exact_match": "provrl.env.rewards",
    "token_f1": "provrl.env.rewards",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
