"""The one config schema: the root `AjetConfig`, its sections in the order a YAML lists them.

Every setting and its default lives in a section module, beside the comment that documents it:
`ajet.config.run` (project, model, workflow, trainer, logging, pipeline), `ajet.config.tasks`
(task_reader, env, judge, eval), `ajet.config.learning` (rollout, context, algorithm, distill, sft)
and `ajet.config.deploy` (ray, serve, sandbox, trinity, verl, tinker, services); the choices are in
`ajet.config.choices`. All are re-exported here: the schema is where users look.

A user's YAML is merged over these defaults and dotted CLI overrides over that
(OmegaConf structured configs), so an unknown key or a wrong type fails at load
time with the key's dotted path, and so does a value outside its declared range (`bounded`)
or a non-finite float. `configs/default.yaml` is generated from this
schema (`ajet config --defaults`) and a test keeps the two identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ajet.config.choices import (
    BUILTIN_JUDGES,
    Backbone,
    ClientReward,
    DpoLoss,
    DType,
    EngineDType,
    EnvType,
    EvalSplit,
    LossAgg,
    LrSchedule,
    OnError,
    OptimizerStateDType,
    OverflowPolicy,
    PassOver,
    ReaderType,
    ReferenceModel,
    SandboxBackend,
    StepCredit,
    ToolCallGrammar,
)
from ajet.config.deploy import (
    EnvServiceConfig,
    RayConfig,
    SandboxConfig,
    ServeConfig,
    TinkerConfig,
    TrinityConfig,
    VerlConfig,
    VllmServerConfig,
)
from ajet.config.learning import (
    AlgorithmConfig,
    ContextConfig,
    CoresetConfig,
    CoresetStrategy,
    DistillConfig,
    DynamicSamplingConfig,
    ReplayConfig,
    RolloutConfig,
    SftConfig,
)
from ajet.config.run import (
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    PipelineConfig,
    ProjectConfig,
    TrainerConfig,
    WorkflowConfig,
)
from ajet.config.tasks import (
    SPLIT_SEED_STRIDE,
    CurriculumConfig,
    EnvConfig,
    EnvServiceReaderConfig,
    EvalConfig,
    GenerateReaderConfig,
    GroupRankConfig,
    GymnasiumEnvConfig,
    HfDatasetReaderConfig,
    JsonlReaderConfig,
    JudgeConfig,
    ReasoningGymEnvConfig,
    TaskReaderConfig,
    TaskSelectionConfig,
)

__all__ = [
    # the root and its sections
    "AjetConfig",
    "ProjectConfig", "ModelConfig", "LoraConfig", "WorkflowConfig",
    "TaskReaderConfig", "JsonlReaderConfig", "HfDatasetReaderConfig", "EnvServiceReaderConfig",
    "GenerateReaderConfig", "CurriculumConfig", "TaskSelectionConfig",
    "EnvConfig", "ReasoningGymEnvConfig", "GymnasiumEnvConfig", "SPLIT_SEED_STRIDE",
    "JudgeConfig", "GroupRankConfig",
    "RolloutConfig", "DynamicSamplingConfig", "ContextConfig", "AlgorithmConfig", "DistillConfig",
    "TrainerConfig", "SftConfig", "CoresetConfig", "CoresetStrategy", "ReplayConfig",
    "EvalConfig", "PipelineConfig", "LoggingConfig",
    "RayConfig", "ServeConfig", "SandboxConfig", "TrinityConfig", "VerlConfig", "TinkerConfig",
    "EnvServiceConfig",
    "VllmServerConfig",
    # the choices (ajet.config.choices)
    "BUILTIN_JUDGES", "Backbone", "ClientReward", "DpoLoss", "DType", "EngineDType", "EnvType", "EvalSplit", "LossAgg",
    "LrSchedule", "OnError", "OptimizerStateDType", "OverflowPolicy", "PassOver", "ReaderType", "ReferenceModel",
    "SandboxBackend", "StepCredit", "ToolCallGrammar",
]


@dataclass
class AjetConfig:
    project: ProjectConfig = field(default_factory=ProjectConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    task_reader: TaskReaderConfig = field(default_factory=TaskReaderConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    trinity: TrinityConfig = field(default_factory=TrinityConfig)
    verl: VerlConfig = field(default_factory=VerlConfig)
    tinker: TinkerConfig = field(default_factory=TinkerConfig)
    # name -> service, started by `--with-env NAME` (ajet/service_specs.py; ajet/launcher.py starts it).
    env_services: dict[str, EnvServiceConfig] = field(default_factory=dict)
    # name -> vLLM server, started by `--with-vllm NAME` on free GPUs (ajet/service_specs.py; ajet/launcher.py starts it).
    vllm_servers: dict[str, VllmServerConfig] = field(default_factory=dict)
