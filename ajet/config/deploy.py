"""The schema's sections about where a run's parts live: Ray, `ajet serve`, helper services
(environments, vLLM servers) and the remote backbones (trinity, verl, tinker). Part of the one schema
(`ajet.config.schema` re-exports them; defaults live here and nowhere else)."""

from __future__ import annotations

from dataclasses import dataclass, field

from annotated_types import Ge, Gt, Interval

from ajet.config.choices import ClientReward, SandboxBackend
from ajet.config.ranges import bounded


@dataclass
class RayConfig:
    # Address of an existing cluster to join; "" starts a local one with --with-ray.
    address: str = ""
    num_rollout_workers: int = bounded(2, Ge(1))
    # Where a Ray that ajet starts (--with-ray's local one, the GPU backbones' head) listens.
    # Ray runs any code sent to its ports (Ray Client 10001, the GCS): 127.0.0.1 keeps them all
    # on loopback; name this node's address only on a private network, for other nodes to join.
    node_ip: str = "127.0.0.1"


@dataclass
class SandboxConfig:
    # Model-written code (ajet.sandbox, docs/sandbox.md). enabled: the workflow runs code, so the
    # start (and --dry-run) checks that the sandbox works here and stops with the fix if not.
    enabled: bool = False
    backend: SandboxBackend = SandboxBackend.bwrap
    # Warm sandboxes kept ready: one serves one episode, and is killed at its end.
    pool_size: int = bounded(2, Ge(0))
    # backend=service: the sandbox service (python -m ajet.sandbox.service) and its token.
    service_url: str = ""
    service_token: str = ""
    # backend=ray (with --with-ray): Ray actors holding pool_size sandboxes each, on the nodes Ray
    # places them on, shared by every process of the run (ajet/sandbox/ray_pool.py).
    ray_hosts: int = bounded(1, Ge(1))
    # Caps on each call; disk_mb caps the work dir (and /tmp) of a sandbox.
    wall_s: float = bounded(10.0, Gt(0))
    cpu_s: float = bounded(10.0, Gt(0))
    memory_mb: int = bounded(512, Ge(32))
    processes: int = bounded(32, Ge(2))
    output_bytes: int = bounded(16384, Ge(256))
    disk_mb: int = bounded(64, Ge(1))
    # The interpreter model code runs on; "" = the one ajet's venv was made from (stdlib only).
    python: str = ""


@dataclass
class ServeConfig:
    # `ajet serve`: episodes come from clients through the episode API (docs/episode_api.md).
    # Where the gateway (episode API + OpenAI-compatible model endpoint) listens; port 0 = a free port.
    host: str = "127.0.0.1"
    port: int = bounded(0, Interval(ge=0, le=65535))
    # The token clients send as `Authorization: Bearer <token>`; "" = a random one, printed at start.
    client_token: str = ""
    # The task metadata keys a client sees. A ticket carries the task's id, query, initial
    # messages and env type, and of its metadata only these keys (default: none), so no other
    # column of the data (a reference answer, a solution) reaches a client; the judge still
    # scores on the server with the full task. E.g. countdown's clients need [numbers, target].
    public_metadata_keys: list[str] = field(default_factory=list)
    # Whether a client's `reward` in `finish` is trained on. A client is not trusted with the grade
    # when the server has a judge: auto refuses it then (400 client_reward_refused; finish without
    # a reward and the judge scores the episode) and accepts it without one; accept / refuse always.
    client_reward: ClientReward = ClientReward.auto


@dataclass
class EnvServiceConfig:
    # An environment service the launcher starts with `--with-env NAME` and stops on exit.
    # Command line (no shell); a leading `python` means the interpreter running ajet.
    command: str = ""
    # Polled until it answers HTTP 2xx; "" = only check the process stays up.
    health_url: str = ""
    startup_timeout_s: float = bounded(60.0, Gt(0))
    # Working directory ("" = the current one) and extra environment variables.
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class VllmServerConfig:
    # A vLLM OpenAI server the launcher starts with `--with-vllm NAME` (GPU machines) and stops
    # on exit: e.g. the model of an LLM judge or of a multi-agent workflow's untrained roles.
    # Clients use base_url http://127.0.0.1:{port}/v1 and model NAME.
    model: str = ""  # a local checkpoint directory (or what vLLM can load offline)
    port: int = bounded(8001, Interval(ge=0, le=65535))
    gpus: int = bounded(1, Ge(1))  # free GPUs it takes (tensor parallel size)
    gpu_memory_utilization: float = bounded(0.9, Interval(gt=0, le=1))
    max_model_len: int = bounded(0, Ge(0))  # 0 = vLLM's default (the model's)
    # More `vllm serve` options, e.g. ["--dtype", "bfloat16"].
    extra_args: list[str] = field(default_factory=list)
    startup_timeout_s: float = bounded(900.0, Gt(0))


@dataclass
class TrinityConfig:
    # Trinity-RFT specific; translated into its Config by the trinity backbone.
    explorer_gpus: int = bounded(1, Ge(1))
    trainer_gpus: int = bounded(1, Ge(1))
    sync_interval: int = bounded(1, Ge(1))
    sync_method: str = "nccl"
    algorithm_type: str = "multi_step_grpo"


@dataclass
class VerlConfig:
    # verl specific; translated into its Hydra config by the verl backbone.
    n_gpus_per_node: int = bounded(1, Ge(1))
    nnodes: int = bounded(1, Ge(1))
    strategy: str = "fsdp"
    gpu_memory_utilization: float = bounded(0.5, Interval(gt=0, le=1))
    tensor_model_parallel_size: int = bounded(1, Ge(1))


@dataclass
class TinkerConfig:
    # The tinker backbone (docs/tinker.md): the workflow runs here, sampling and training on a
    # Tinker-compatible service (hosted Tinker, `ajet tinker`, SkyRL tx). The adapter it trains is
    # `model.lora` (Tinker trains LoRA only: enabled, r, target_modules; alpha is the service's).
    base_url: str = ""  # "" = the SDK's default: $TINKER_BASE_URL, else the hosted service
    # "" = $TINKER_API_KEY (what the SDK reads); or `${file:PATH}` / `${oc.env:NAME}`, never a literal key.
    api_key: str = ""
    base_model: str = ""  # the service's model name (`get_server_capabilities()` lists them)
    request_timeout_s: float = bounded(600.0, Gt(0))  # how long one service request may take
