"""The env-service protocol, in one place: its routes, what each takes and what each answers.

Both servers speak it (the reference environment server, `ajet.task_reader.env_server`, and the
sandbox service, `ajet.sandbox.service`), and both clients (`ajet.task_reader.env_client`'s, and
`RemoteSandbox`): each imports the models below instead of declaring its own. JSON bodies; an
error is an HTTP 4xx with {"detail": "..."}:

    GET  /health                           -> {status, env_types}
    POST /list_tasks {env_type, split}     -> {task_ids}
    POST /create     {env_type, task_id}   -> {instance_id, observation, info}
    POST /step       {instance_id, action} -> {observation, reward, done, info}
    POST /evaluate   {instance_id}         -> {reward, is_success, ...}
    POST /release    {instance_id}         -> {released}

Any server that speaks it works with `EnvServiceClient` and the env_service reader.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

HEALTH = "/health"
LIST_TASKS = "/list_tasks"
CREATE = "/create"
STEP = "/step"
EVALUATE = "/evaluate"
RELEASE = "/release"
# The reference env server's token, where clients find it too: every route but /health needs
# `Authorization: Bearer <token>` when it is set.
TOKEN_ENV = "AJET_ENV_TOKEN"
# Sent again only if they never reached the server: a timed-out step or create may have been applied.
NOT_IDEMPOTENT = frozenset({CREATE, STEP})


# ------------------------------------------------------------------ what a client sends
class ListTasksRequest(BaseModel):
    env_type: str
    split: str = "train"


class CreateRequest(BaseModel):
    env_type: str
    task_id: str = ""  # "": an instance with no task of the environment's (the sandbox)


class StepRequest(BaseModel):
    instance_id: str
    action: Any  # the environment says what it takes (the sandbox: an object, see its service)


class InstanceRequest(BaseModel):
    instance_id: str


# ------------------------------------------------------------------ what a server answers
class Answer(BaseModel):
    """The fields a route must answer with; a server may add its own."""

    model_config = ConfigDict(extra="allow")


class TaskIds(Answer):
    task_ids: list[str]


class Created(Answer):
    instance_id: str


class Stepped(Answer):
    observation: Any
    reward: float = 0.0
    done: bool


class Evaluated(Answer):
    reward: float


# What each route must answer (a client checks it: `EnvServiceClient`).
ANSWERS: dict[str, type[Answer]] = {LIST_TASKS: TaskIds, CREATE: Created, STEP: Stepped, EVALUATE: Evaluated}
