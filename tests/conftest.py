"""Shared fixtures (the bundled model, a tiny random model with the same tokenizer, run YAMLs,
the benchmark scripts as modules), and the skip checks: with CI=true a skipped test fails the
session unless tests/skip_allowlist.txt allows it; on every machine, a test with a skipif on a
CPU feature that the allow-list does not name fails (whether or not this machine has it); and
the order in which the tests run (the longest first)."""

from __future__ import annotations

import importlib
import logging
import os
import re
import signal
from collections.abc import Callable, Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# The `pytester` fixture: tests/unit/test_skip_allowlist.py runs small suites with the check.
pytest_plugins = ["pytester"]

# Tests run with the library's defaults but never touch the user's real cache.
os.environ.setdefault("AJET_CACHE_DIR", str(Path.home() / ".cache" / "ajet"))

@pytest.fixture
def script() -> Callable[[str], ModuleType]:
    """`script("bench.engine")`: a module of scripts/ (`scripts.bench.engine`), imported as the
    scripts import each other (the repository's root is on sys.path: pyproject's pytest pythonpath)."""
    return lambda name: importlib.import_module(f"scripts.{name}")


# A workflow that imports and loads (what --dry-run checks).
STUB_WORKFLOW = "from ajet import Workflow\n\n\nclass W(Workflow):\n    async def execute(self, task, tuner): ...\n"


@pytest.fixture(scope="session")
def bundled_model_dir() -> Path:
    """The converted bundled SmolLM2-135M-Instruct checkpoint (converted once, cached)."""
    from ajet.models.resolve import bundled_checkpoint

    return bundled_checkpoint()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, bundled_model_dir: Path) -> Path:
    """A 2-layer random Llama with the bundled tokenizer and chat template (fast, deterministic)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny_model")
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tinker_server(request: pytest.FixtureRequest, tiny_model_dir: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """`ajet tinker` in-process on a free port over the tiny model, for a test module; its API
    key is the module's `KEY`."""
    pytest.importorskip("tinker", reason="the Tinker SDK: pip install 'ajet[tinker]'")
    from ajet.tinker_service.server import ServerOptions, TinkerServer

    options = ServerOptions(model=str(tiny_model_dir), state_dir=tmp_path_factory.mktemp("tinker_state"), port=0)
    server = TinkerServer(options, request.module.KEY).setup().start()
    yield server
    server.stop()


TWO_CALLS = '''
from ajet import Workflow, WorkflowOutput


class TwoCalls(Workflow):
    async def execute(self, task, tuner):
        messages = [{"role": "user", "content": task.main_query}]
        first = await tuner(messages)
        text = "".join(b.get("text", "") for b in first.content if b.get("type") == "text")
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "More."}]
        await tuner(messages)
        return WorkflowOutput(reward=0.25, log_metrics={"turns": 2})
'''


@pytest.fixture()
def two_calls_conf(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A run YAML in tmp_path: the tiny model, three tasks, and a workflow that makes two chat
    calls (the second extends the first, after an untrained user turn) for reward 0.25."""
    import json

    (tmp_path / "agent.py").write_text(TWO_CALLS)
    (tmp_path / "train.jsonl").write_text("".join(
        json.dumps({"task_id": f"t{i}", "question": f"Count to {i + 2}."}) + "\n" for i in range(3)))
    conf = tmp_path / "run.yaml"
    conf.write_text(f"model: {{path: {tiny_model_dir}}}\nworkflow: {{target: agent.py:TwoCalls}}\n"
                    "task_reader: {jsonl: {train_path: train.jsonl}}\nrollout: {max_tokens: 6, n: 2}\n")
    return conf


@pytest.fixture()
def evaluated_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`ajet eval` without evaluating: `ajet.eval.runner.evaluate` is replaced by a stand-in that
    records the `model.path` it was given (into the returned list) and reports a fixed score."""
    from ajet.eval import runner as eval_runner

    seen: list[str] = []

    def fake_evaluate(cfg, **kwargs):  # noqa: ANN001, ANN202 - stands in for the real evaluation
        seen.append(cfg.model.path)
        return eval_runner.EvalReport(path=tmp_path / "eval_x.json", name="x", model=cfg.model.path,
                                      metrics={"success/rate": 0.5}, results=[])

    monkeypatch.setattr(eval_runner, "evaluate", fake_evaluate)
    return seen


@pytest.fixture()
def stub_run_conf(tmp_path: Path):
    """`stub_run_conf(body="")` writes tmp_path/run.yaml whose model, workflow and data only
    exist (enough for --dry-run, the backbone checks and the drivers' `prepare`); `body` adds
    YAML lines. Returns its path."""

    def write(body: str = "") -> Path:
        model = tmp_path / "model"
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text("{}")
        (tmp_path / "agent.py").write_text(STUB_WORKFLOW)  # --dry-run imports it
        (tmp_path / "train.jsonl").write_text('{"question": "q"}\n')
        path = tmp_path / "run.yaml"
        path.write_text(f"model: {{path: {model}}}\nworkflow: {{target: agent.py:W}}\n"
                        f"task_reader: {{jsonl: {{train_path: train.jsonl}}}}\n" + body)
        return path

    return write


# --- CI: a skip is a failure unless the allow-list names it ----------------------------------
# A required dependency that does not import must fail the run, not turn its tests into skips.
# Only what is truly optional on a CI machine may skip (a GPU, a backbone's own environment, a
# browser, npm's registry): tests/skip_allowlist.txt lists those tests, each with its reason.

SKIP_ALLOWLIST = Path(__file__).with_name("skip_allowlist.txt")


def read_skip_allowlist(path: Path) -> list[str]:
    """The nodeid patterns (fnmatch) of `path`, one `PATTERN  # reason` a line; blank lines and
    lines starting with `#` are comments. A pattern without its reason is a usage error."""
    patterns = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        pattern, _, reason = line.partition("#")
        if not pattern.strip():
            continue
        if not reason.strip():
            raise pytest.UsageError(f"{path}:{number}: {pattern.strip()!r} has no reason: "
                                    "write `PATTERN  # why this test may skip`")
        patterns.append(pattern.strip())
    return patterns


def allowed(nodeid: str, patterns: list[str]) -> bool:
    return any(fnmatchcase(nodeid, pattern) for pattern in patterns)


class SkipGuard:
    """Collects the skips whose nodeid no allow-list pattern matches and fails the session."""

    def __init__(self, patterns: list[str], allowlist: str) -> None:
        self.patterns = patterns
        self.allowlist = allowlist
        self.offending: list[tuple[str, str]] = []

    def check(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):  # an xfail is not a skip
            return
        if not allowed(report.nodeid, self.patterns):
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.offending.append((report.nodeid, reason.removeprefix("Skipped: ")))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:  # a module-level skip
        self.check(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.check(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        passed = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        if self.offending and session.exitstatus in passed:  # a run that failed keeps its status
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.offending:
            return
        title = f"CI=true: {len(self.offending)} skipped test(s) not in {self.allowlist}"
        terminalreporter.write_sep("=", title, red=True, bold=True)
        for nodeid, reason in self.offending:
            terminalreporter.write_line(f"{nodeid}: {reason}")
        terminalreporter.write_line(
            "A skip hides a test that did not run. Make it run (a required dependency is imported, not "
            "importorskip'd), or, if what it needs is truly optional on this machine (a GPU, a backbone's "
            f"environment, a browser, the network), add `NODEID-PATTERN  # reason` to {self.allowlist}.")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("CI", "").lower() == "true":
        guard = SkipGuard(read_skip_allowlist(SKIP_ALLOWLIST), shown_allowlist(config))
        config.pluginmanager.register(guard, "ajet-skip-guard")


def shown_allowlist(config: pytest.Config) -> str:
    return os.path.relpath(SKIP_ALLOWLIST, config.rootpath)


# --- Every machine: a skip on a CPU feature is in the allow-list ------------------------------
# CI's and the developers' machines are of three CPU types (AVX2 only; AVX-512 with avx512_bf16;
# AVX-512 with AMX), drawn by chance. A test that needs a feature skips on the types without it,
# where the guard above fails the run unless the allow-list names the test: a missing line once
# turned CI red on the AVX2 type only. On a machine that has the feature the skipif never fires,
# so this check reads each skipif's reason rather than its outcome, and runs on every machine.
CPU_FEATURE = re.compile(r"\b(avx\w*|amx\w*|sse\d\w*|fma|f16c|vnni|fbgemm|onednn|mkldnn)\b"
                         r"|cpu (with|feature|flag)|instruction set", re.IGNORECASE)


def cpu_feature_skip(item: pytest.Item) -> str | None:
    """The reason of the item's first `skipif` mark that names a CPU feature, if any."""
    reasons = (str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))
    return next((reason for reason in reasons if CPU_FEATURE.search(reason)), None)


UNLISTED_CPU_SKIP = pytest.StashKey[str]()  # on an item: why it fails at setup


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    longest_first(items)
    mark_unlisted_cpu_feature_skips(config, items)


def mark_unlisted_cpu_feature_skips(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = [(item, reason) for item in items if (reason := cpu_feature_skip(item))]
    if not skips:
        return
    patterns = read_skip_allowlist(SKIP_ALLOWLIST)
    shown = shown_allowlist(config)
    for item, reason in skips:
        if not allowed(item.nodeid, patterns):
            item.stash[UNLISTED_CPU_SKIP] = (
                f"this test skips on a CPU feature ({reason!r}) and {shown} has no line for it: on a "
                "machine type without that feature (AVX2 only; AVX-512 with avx512_bf16; AVX-512 with "
                f"AMX) it would skip, and so fail CI (CI=true). Add `NODEID-PATTERN  # the feature it "
                f"needs` to {shown}, or make the test run on every type (cap or emulate the feature).")


@pytest.hookimpl(tryfirst=True)  # before the skipif is evaluated: it fails where the feature is missing too
def pytest_runtest_setup(item: pytest.Item) -> None:
    if UNLISTED_CPU_SKIP in item.stash:
        pytest.fail(item.stash[UNLISTED_CPU_SKIP], pytrace=False)


# --- Order: the longest tests first ----------------------------------------------------------
# `make test` runs the suite on two pytest-xdist workers, one test file at a time each, in this
# order (--dist loadfile --no-loadscope-reorder). Started last, one long file keeps a worker busy
# while the other idles (the chaos run, 3.5 min, once ended a run 4 minutes after everything
# else); started first, the many short unit tests fill in around the long ones.
RUN_ORDER = ("slow", "integration", "tutorial")  # markers, in order; unmarked tests come last


def longest_first(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, name in enumerate(RUN_ORDER) if item.get_closest_marker(name)), len(RUN_ORDER))

    items.sort(key=rank)  # stable: a file's tests stay together and in their order


VOWEL_JUDGE = '''
class VowelJudge:
    """Reward = share of vowels in the final answer: a random model's replies differ, so GRPO
    groups have signal where a real judge would give every reply 0."""

    def compute_reward(self, task, output):
        text = str(output.metadata.get("final_answer", ""))
        reward = sum(ch in "aeiou" for ch in text) / max(1, len(text))
        return reward, reward > 0.3
'''


@pytest.fixture()
def vowel_judge(tmp_path: Path) -> str:
    """`judge.type` of a judge file in tmp_path (`VOWEL_JUDGE`), for runs on the tiny model."""
    path = tmp_path / "vowel_judge.py"
    path.write_text(VOWEL_JUDGE)
    return f"{path}:VowelJudge"


@pytest.fixture(autouse=True)
def _no_stop_carried_over():
    """Each test starts with no stop recorded (ajet.signals counts stops per process: a second
    one is StopNow)."""
    from ajet.signals import reset

    reset()
    yield
    reset()


@pytest.fixture(autouse=True)
def _no_root_handler_carried_over():
    """A test that runs a CLI in-process (typer's CliRunner) leaves the handler
    `configure_logging` put on the root logger, writing to the runner's stream, closed once the
    command returns: every later log line of that worker then prints a "--- Logging error ---"
    traceback into whatever stderr a later test reads. The root logger's handlers and level are
    put back as they were."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)


# CI may start the suite as a background job (`nohup make test &`), where the shell sets SIGINT
# (and nohup SIGHUP) to ignored. ajet rightly keeps an inherited "ignore" (ajet.signals), so the
# runs these tests start and then stop would ignore the very signals the tests send: the tests
# set the disposition of what they start (children inherit the defaults again).
for _signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(_signum) is signal.SIG_IGN:
        signal.signal(_signum, signal.default_int_handler if _signum == signal.SIGINT else signal.SIG_DFL)
