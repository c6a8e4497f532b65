"""Environments people already have, trained from a YAML with no workflow code (docs/environments.md).

`env: {type: reasoning_gym | gymnasium, id: ..., args: {...}}` names one. Its adapter,
`ajet.envs.<type>`, makes the tasks of each split (`make_tasks`) and runs an episode through the
tuner (`EnvWorkflow`), scored by the environment's own reward. Each task carries in
`metadata["env"]` what the workflow needs to rebuild its environment, so the workflow keeps no
state between episodes and runs wherever the rollout does. The task reader calls
`make_env_tasks`; the config names `ajet.envs.<type>:EnvWorkflow` as the workflow.

A new adapter is a module `ajet/envs/<type>.py` with `make_tasks` and `EnvWorkflow`
(`EnvAdapter`), and a member of `ajet.config.choices.EnvType`.
"""

from ajet.envs.base import EnvAdapter, EnvError, Split, adapter, make_env_tasks, splits

__all__ = ["EnvAdapter", "EnvError", "Split", "adapter", "make_env_tasks", "splits"]
