"""`EpisodeBroker`: what `ajet serve`'s episode API hands out and collects (`ajet.serve.http`).

A client asks for an episode (`begin`), calls the model with the episode's key, then
`finish`es it with a reward (or lets the judge score its metadata) or `abort`s it. The broker
hands out each task `rollout.n` times (one GRPO group), in task-reader order, and the trainer
takes `batch_size` complete groups per step with `next_batch(step)`, which returns the same
`RolloutResult` as `RolloutManager.rollout`.

How far clients may run ahead of the trainer is `rollout.max_staleness` (in policy versions):
while the trainer waits for step k, groups may be opened up to step k + max_staleness. With 0
(the default) no episode begins before the previous update is done, so every episode is
on-policy; with s > 0 clients keep working during an update, and an episode whose oldest call
lags more than s versions behind the weights it would train is dropped (`rollout/failed/stale`),
never silently mixed: the rule of `ajet.rollout.staleness`, which the debug backbone's overlap
applies too. Kept episodes carry their versions (`Episode.policy_versions`; `rollout/stale_kept`
counts the ones that lag).

The ticket's task is an allow-list: the task's id, query, initial messages and env type, and of
its metadata only `serve.public_metadata_keys` (default none): a client never sees a reference
answer or any other column of the data unless the config names it, while the judge scores on the
server with the full task.

A client is not trusted with the grade where the server has a judge: `serve.client_reward`
(auto: refused with a judge, accepted without) decides whether a `reward` in `finish` is
trained on; a refused one is answered 400 before the episode ends, so the client can finish it
again without. A client's `log_metrics` may not use the server's namespaces (`judge/`,
`sandbox/`), and a failing judge's traceback stays in the server's log (the client gets one line).

Tasks come from the reader at the step their group is for, so a curriculum
(`task_reader.curriculum`) ramps as it does in-process. With dynamic sampling
(`rollout.dynamic_sampling`), a group that completes without signal (equal rewards) gives its
place to a group of a new task, up to `max_rounds - 1` times; the replacement is handed out
before any other group, and its step trains on the last group of the chain (the dropped ones
count in `dynamic/*` and `rollout/dropped_groups`, their episodes in the rollout metrics).

A client that neither finishes nor aborts within `rollout.episode_timeout_s` is timed out: its
key dies and the episode counts as `rollout/failed/timeout`. Timeouts are checked whenever the
broker is used (and every second while the trainer waits), so no thread of its own is needed.

Threads: the episode API runs on the gateway's event loop, `next_batch` on the trainer's; one
lock guards the state, and the trainer is woken with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ajet.config.schema import ClientReward, RolloutConfig
from ajet.judge.base import JudgeError
from ajet.judge.group_rank import GroupRankJudge
from ajet.judge.private_keys import private_metadata_keys as judge_private_keys
from ajet.rollout.dynamic import signal_metrics
from ajet.rollout.episode import FAILED, OK, TIMEOUT, Episode
from ajet.rollout.manager import KEPT_METRIC_PREFIXES, RolloutResult, drop_equal_reward_groups
from ajet.rollout.roles import has_signal
from ajet.rollout.runner import SessionFactory
from ajet.rollout.scoring import (
    close_handle,
    collect_refusals,
    collect_tracker,
    episode_roles,
    log_failure,
    maybe_await,
    score_episode,
)
from ajet.rollout.source import curriculum_metrics
from ajet.rollout.staleness import drop_stale, staleness_metrics
from ajet.serve.protocol import (
    ClientRewardRefusedError,
    EpisodeEndedError,
    EpisodeKeyError,
    EpisodeNotFoundError,
    EpisodeResult,
    EpisodeTicket,
    FinishRequest,
    NoEpisodeAvailableError,
    ReservedMetricError,
    RunEndedError,
    ServerStatus,
)
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask

log = logging.getLogger(__name__)

ABORTED = "aborted"
RUN_ENDED = "run_ended"
_POLL_S = 1.0  # the trainer re-checks timeouts at least this often while it waits


class RemoteWorkflow(Workflow):
    """The trainer's workflow under `ajet serve`: it never runs, episodes come from clients."""

    name: str = "remote"

    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        raise RuntimeError("under `ajet serve` episodes come from clients through the episode API; "
                           "nothing runs a workflow in-process")


@dataclass
class _Group:
    task: WorkflowTask
    step: int  # the training step its task was drawn for (the curriculum's step)
    slot: int  # its place among the run's groups (1, 2, ...); a refill takes its group's slot
    draw: int = -1  # the reader's draw of its task (`TaskReader.last_draws`): a step says it trained it
    handed: int = 0
    ended: list[Episode] = field(default_factory=list)
    replaced: list[_Group] = field(default_factory=list)  # dynamic sampling: the groups without signal it replaces

    @property
    def rounds(self) -> int:
        return len(self.replaced) + 1

    @property
    def group_id(self) -> str:
        """The run's 7th group is g7-<task>, its refills g7r1-<task>, g7r2-<task>, ..."""
        refill = f"r{len(self.replaced)}" if self.replaced else ""
        return f"g{self.slot}{refill}-{self.task.task_id}"

    @property
    def has_signal(self) -> bool:
        """Whether its ok episodes' rewards differ (`ajet.rollout.roles.has_signal`)."""
        return has_signal([e for e in self.ended if e.status == OK])


@dataclass
class _Running:
    episode: Episode
    group: _Group
    handle: Any
    started: float
    deadline: float
    key: str = ""  # the episode's api_key: what finish and abort must show


class EpisodeBroker:
    def __init__(self, reader: Any, judge: Any, sessions: SessionFactory, rollout: RolloutConfig, *,
                 batch_size: int, total_steps: int, policy_version: Callable[[], int],
                 max_staleness: int = 0, start_step: int = 0, role: str = "default",
                 public_metadata_keys: Iterable[str] = (), client_reward: ClientReward,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`reader`: the task reader (`next_batch(1)`); `sessions`: opens a tracked session per
        episode (its tuner mints the episode key); `policy_version`: the engine's current version;
        `public_metadata_keys`: the task metadata keys a client sees (the rest stays here);
        `client_reward`: whether a client's own reward is trained on (`serve.client_reward`)."""
        if isinstance(judge, GroupRankJudge):  # `finish` answers with the episode's reward
            raise JudgeError("judge.type=group_rank cannot score episodes of the episode API (each gets its "
                             "reward when it finishes); use a per-episode judge, e.g. judge.type=llm")
        self.reader, self.judge, self.sessions, self.rollout = reader, judge, sessions, rollout
        # A step trains the first complete groups, whatever step they were drawn for: the reader's
        # checkpointed state must know which draws each step trained (a held group stays open).
        reader.track_trained()
        self.batch_size, self.total_steps = batch_size, total_steps
        self.max_staleness, self.role = max_staleness, role
        self._policy_version, self._clock = policy_version, clock
        self._lock = threading.Lock()
        self._groups: deque[_Group] = deque()  # opened, with episodes still to hand out
        self._ready: deque[_Group] = deque()  # complete, waiting for the trainer
        self._pending: dict[str, _Group] = {}  # opened, not complete yet
        self._running: dict[str, _Running] = {}
        self._ended: dict[str, str] = {}  # episode id -> how it ended (for 409s)
        self._opened = start_step * batch_size  # groups opened since step 0
        self._step = start_step  # the step the trainer last asked for (for status)
        # Groups may be opened up to step `_gather + max_staleness`: `_gather` is the step the
        # trainer waits for, or last waited for while it updates the weights (episodes begun
        # then would lag one version more); before its first ask, the first step to come.
        self._gather = start_step + 1
        self._closed = False
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        self._counts = dict(finished=0, aborted=0, timed_out=0, dropped_stale=0)
        self._max_running = 0
        self._last_metrics: dict[str, float] = {}
        self.public_metadata_keys = frozenset(public_metadata_keys)
        self.accepts_client_reward = accepts_client_reward(ClientReward(client_reward), judge)
        log.info("episode API: a client's reward is %s (serve.client_reward=%s)",
                 "trained on" if self.accepts_client_reward else "refused: the judge scores every episode",
                 ClientReward(client_reward).value)
        log.info("episode API: clients see each task's id, query, initial messages and env type, and of its "
                 "metadata %s (serve.public_metadata_keys); the rest stays on the server",
                 sorted(self.public_metadata_keys) or "no key")
        if graded := sorted(self.public_metadata_keys & judge_private_keys(judge)):
            log.warning("serve.public_metadata_keys shows clients %s, which the judge compares with: a client "
                        "can score itself (and the policy learn to copy it)", graded)

    # ------------------------------------------------------------------ the client side
    async def begin(self) -> EpisodeTicket:
        with self._lock:
            self._reap_locked()
            if self._closed:
                raise RunEndedError("the run has ended: no more episodes")
            group = self._next_group_locked()
            index = group.handed
            group.handed += 1
            if group.handed == self.rollout.n:
                self._groups.popleft()
            episode = Episode(episode_id=f"{group.group_id}-e{index}", task=group.task, group_id=group.group_id)
            # Reserved before the session opens, so a concurrent begin never takes the same slot.
            now = self._clock()
            running = _Running(episode, group, None, now, now + self.rollout.episode_timeout_s)
            self._running[episode.episode_id] = running
            self._max_running = max(self._max_running, len(self._running))
        try:
            running.handle = await maybe_await(self.sessions.open_episode(episode.episode_id, group.task))
            base_url, key = running.handle.tuner.base_url_and_key(self.role)
            running.key = key
        except Exception as exc:
            with self._lock:
                self._running.pop(episode.episode_id, None)
                episode.status, episode.reason = FAILED, f"session_error:{type(exc).__name__}"
                episode.error_message = str(exc)
                self._end_locked(episode, group)
            raise
        log.debug("episode %s handed out (task %s)", episode.episode_id, group.task.task_id)
        return EpisodeTicket(episode_id=episode.episode_id, task=self._public_task(group.task),
                             base_url=base_url, api_key=key, model="policy")

    async def finish(self, episode_id: str, key: str, request: FinishRequest) -> EpisodeResult:
        self._refuse_untrusted(request)  # before the episode ends: the client may finish it again
        running = self._take_running(episode_id, key)
        episode = running.episode
        # The key dies first: no call can land in the records after the reward is given.
        await close_handle(running.handle, episode_id)
        output = WorkflowOutput(reward=request.reward, is_success=request.is_success,
                                metadata=request.metadata, log_metrics=request.log_metrics)
        await score_episode(episode, output, self.judge, self.rollout.episode_timeout_s,
                            roles=episode_roles(running.handle, also=(self.role,)))
        collect_tracker(episode, running.handle.tracker)
        collect_refusals(episode, running.handle)
        if episode.reason.startswith(JUDGE_ERROR):  # the client gets one line (`_result`), the log all
            log.warning("episode %s: the judge failed (%s); the client is told only that:\n%s", episode_id,
                        episode.reason, episode.error_message)
        with self._lock:
            episode.duration_s = self._clock() - running.started
            self._counts["finished"] += 1
            self._end_locked(episode, running.group)
        return _result(episode)

    async def abort(self, episode_id: str, key: str, reason: str) -> EpisodeResult:
        running = self._take_running(episode_id, key)
        episode = running.episode
        await close_handle(running.handle, episode_id)
        episode.status, episode.reason = FAILED, ABORTED
        episode.error_message = f"aborted by the client: {reason}" if reason else "aborted by the client"
        collect_tracker(episode, running.handle.tracker)
        collect_refusals(episode, running.handle)
        log_failure(episode, None)
        with self._lock:
            episode.duration_s = self._clock() - running.started
            self._counts["aborted"] += 1
            self._end_locked(episode, running.group)
        return _result(episode)

    async def status(self) -> ServerStatus:
        with self._lock:
            self._reap_locked()
            waiting = sum(len(g.ended) for g in (*self._pending.values(), *self._ready))
            return ServerStatus(
                step=self._step, policy_version=self._policy_version(),
                episodes_running=len(self._running), episodes_waiting=waiting,
                episodes_finished=self._counts["finished"], episodes_aborted=self._counts["aborted"],
                episodes_timed_out=self._counts["timed_out"],
                episodes_dropped_stale=self._counts["dropped_stale"],
                groups_ready=len(self._ready), closed=self._closed, last_metrics=dict(self._last_metrics))

    # ------------------------------------------------------------------ the trainer side
    async def next_batch(self, step: int) -> RolloutResult:
        """Wait for `batch_size` complete groups and return them as a rollout of step `step`."""
        loop, wake = asyncio.get_running_loop(), asyncio.Event()
        start = self._clock()
        with self._lock:
            self._step = self._gather = step
            self._waiter = (loop, wake)
        try:
            while True:
                wake.clear()
                with self._lock:
                    self._reap_locked()
                    if self._closed:
                        raise RunEndedError(f"the episode broker closed while step {step} waited for episodes")
                    if len(self._ready) >= self.batch_size:
                        # The oldest steps' groups first (a refill completes after groups of the
                        # next step): a group trained later than its step may lag too far.
                        groups = sorted(self._ready, key=lambda g: g.step)[: self.batch_size]
                        for group in groups:
                            self._ready.remove(group)
                        # Used up by this step (a replaced group too), once it is committed.
                        self.reader.mark_trained([g.draw for group in groups for g in (*group.replaced, group)],
                                                 step)
                        max_running, self._max_running = self._max_running, len(self._running)
                        break
                    timeout = self._poll_timeout_locked()
                try:
                    await asyncio.wait_for(wake.wait(), timeout)
                except asyncio.TimeoutError:
                    pass
        finally:
            with self._lock:
                self._waiter = None
        result = self._result(groups, max_running)
        result.extra_metrics["remote/wait_s"] = self._clock() - start
        return result

    def record_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """The trainer's metrics of `step`, shown by `GET /v1/status`."""
        with self._lock:
            self._last_metrics = {"step": float(step), **metrics}

    def close(self) -> None:
        """No more episodes: running ones end (`run_ended`, their keys die), waiters wake up."""
        with self._lock:
            self._closed = True
            running, self._running = list(self._running.values()), {}
            for item in running:
                item.episode.status, item.episode.reason = FAILED, RUN_ENDED
                self._ended[item.episode.episode_id] = RUN_ENDED
            self._wake_locked()
        for item in running:
            if item.handle is not None:
                item.handle.close()
        if running:
            log.info("episode broker closed with %d episodes still running (not trained on)", len(running))

    # ------------------------------------------------------------------ internals
    def _refuse_untrusted(self, request: FinishRequest) -> None:
        """A client's reward where the judge grades (`serve.client_reward`), and metric names in the
        server's namespaces (a client's `judge/accuracy` would pass for the judge's), are refused."""
        if request.reward is not None and not self.accepts_client_reward:
            raise ClientRewardRefusedError(
                "this server's judge scores every episode (serve.client_reward refuses a client's reward): "
                "finish without `reward`, with what the judge reads in `metadata`")
        if reserved := sorted(k for k in request.log_metrics if k.startswith(KEPT_METRIC_PREFIXES)):
            raise ReservedMetricError(
                f"log_metrics {reserved}: {', '.join(KEPT_METRIC_PREFIXES)} name the server's own metrics; "
                "name yours without that prefix (a client's metrics are logged as workflow/<key>)")

    def _public_task(self, task: WorkflowTask) -> dict[str, Any]:
        """The task as a client sees it: named fields, and only the public metadata keys."""
        full = task.model_dump(mode="json")
        public = {key: full[key] for key in ("task_id", "main_query", "init_messages", "env_type")}
        public["metadata"] = {k: v for k, v in full["metadata"].items() if k in self.public_metadata_keys}
        return public

    def _next_group_locked(self) -> _Group:
        if self._groups:
            return self._groups[0]
        total = self.total_steps * self.batch_size
        if self._opened >= total:
            if self.rollout.dynamic_sampling.enabled and self._pending:  # a running group may yet be replaced
                raise NoEpisodeAvailableError(
                    f"all {total} groups of the run are handed out; retry: dynamic sampling may replace one "
                    "still running")
            raise RunEndedError(f"all {total} groups of the run's {self.total_steps} steps are handed out")
        if self._opened >= min(total, (self._gather + self.max_staleness) * self.batch_size):
            raise NoEpisodeAvailableError(
                f"the groups of the next {1 + self.max_staleness} step(s) are handed out; "
                "retry when the trainer has taken a batch (rollout.max_staleness allows more)")
        step = self._opened // self.batch_size + 1
        (task,) = self.reader.next_batch(1, step=step)
        self._opened += 1
        group = _Group(task=task, step=step, slot=self._opened, draw=self.reader.last_draws[0])
        self._groups.append(group)
        self._pending[group.group_id] = group
        return group

    def _refill_locked(self, group: _Group) -> bool:
        """Dynamic sampling: replace a complete group without signal by a group of a new task
        (handed out first), while its chain has rounds left. False: the group stays."""
        sampling = self.rollout.dynamic_sampling
        if not sampling.enabled or self._closed or group.rounds >= sampling.max_rounds or group.has_signal:
            return False
        (task,) = self.reader.next_batch(1, step=group.step)
        refill = _Group(task=task, step=group.step, slot=group.slot, replaced=[*group.replaced, group],
                        draw=self.reader.last_draws[0])
        self._groups.appendleft(refill)
        self._pending[refill.group_id] = refill
        log.debug("dynamic sampling: group %s has no signal; %s takes its place", group.group_id, refill.group_id)
        return True

    def _take_running(self, episode_id: str, key: str) -> _Running:
        with self._lock:
            self._reap_locked()
            running = self._running.get(episode_id)
            if running is None or running.handle is None:
                ended = self._ended.get(episode_id)
                if ended is not None or running is not None:
                    raise EpisodeEndedError(f"episode {episode_id} already ended ({ended or 'starting'})")
                raise EpisodeNotFoundError(f"no episode {episode_id}")
            if not secrets.compare_digest(key.encode(), running.key.encode()):
                raise EpisodeKeyError(f"episode {episode_id} can be ended only by the client that began it: send "
                                      "its api_key (from the ticket) in the X-Episode-Key header")
            del self._running[episode_id]
            self._ended[episode_id] = "ending"
            return running

    def _reap_locked(self) -> None:
        now = self._clock()
        for episode_id in [i for i, r in self._running.items() if r.deadline <= now and r.handle is not None]:
            running = self._running.pop(episode_id)
            episode = running.episode
            running.handle.close()
            episode.status, episode.reason = TIMEOUT, "timeout"
            episode.error_message = (f"no finish or abort within rollout.episode_timeout_s="
                                     f"{self.rollout.episode_timeout_s}s (client gone?)")
            episode.duration_s = now - running.started
            collect_tracker(episode, running.handle.tracker)
            collect_refusals(episode, running.handle)
            log_failure(episode, None)
            self._counts["timed_out"] += 1
            self._end_locked(episode, running.group)

    def _end_locked(self, episode: Episode, group: _Group) -> None:
        self._ended[episode.episode_id] = episode.reason or episode.status
        group.ended.append(episode)
        if len(group.ended) == self.rollout.n:
            self._pending.pop(group.group_id, None)
            if self._refill_locked(group):
                return
            self._ready.append(group)
            self._wake_locked()

    def _wake_locked(self) -> None:
        if self._waiter is None:
            return
        loop, wake = self._waiter
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError:  # the trainer's loop closed: nobody is waiting any more
            self._waiter = None

    def _poll_timeout_locked(self) -> float:
        deadlines = [r.deadline for r in self._running.values()]
        return max(0.01, min([_POLL_S, *(d - self._clock() for d in deadlines)]))

    def _result(self, groups: list[_Group], max_running: int) -> RolloutResult:
        version = self._policy_version()
        replaced = [r for g in groups for r in g.replaced]  # dynamic sampling's groups without signal
        episodes = [e for g in (*replaced, *groups) for e in g.ended]
        # Only the groups the step trains on: a replaced group is never trained, whatever its age.
        stale, kept_lags = drop_stale([e for g in groups for e in g.ended], version, self.max_staleness)
        ok = [e for g in groups for e in g.ended if e.status == OK]
        dropped = [r.group_id for r in replaced]
        if self.rollout.drop_equal_reward_groups:
            ok, dropped_now = drop_equal_reward_groups(ok)
            dropped += dropped_now
        with self._lock:
            self._counts["dropped_stale"] += len(stale)
            for episode in episodes:  # their ids are not needed for 409s any more
                self._ended.pop(episode.episode_id, None)
            extra = {
                **staleness_metrics(kept_lags),
                "remote/episodes_running": float(len(self._running)),
                "remote/groups_ready": float(len(self._ready)),
            }
        if self.rollout.dynamic_sampling.enabled:
            kept = sum(g.has_signal for g in groups)
            extra.update(signal_metrics(
                rounds=max(g.rounds for g in groups), tasks=len(groups) + len(replaced), kept=kept,
                dropped=len(replaced) + len(groups) - kept, surplus=0, episodes=len(episodes)))
        result = RolloutResult(episodes=episodes, ok_episodes=ok, dropped_groups=dropped,
                               max_in_flight=max_running, extra_metrics=extra)
        curriculum_metrics(self.reader, max(g.step for g in groups), result)
        with self._lock:
            self._last_metrics = result.metrics()
        return result


def accepts_client_reward(policy: ClientReward, judge: Any) -> bool:
    """`serve.client_reward`: auto accepts a client's reward only where no judge scores episodes."""
    return policy is ClientReward.accept or (policy is ClientReward.auto and judge is None)


JUDGE_ERROR = "judge_error:"


def _result(episode: Episode) -> EpisodeResult:
    ok = episode.status == OK
    if ok:
        detail = ""
    elif episode.reason.startswith(JUDGE_ERROR):  # its traceback (the server's code, the task) is logged
        detail = f"the judge failed ({episode.reason}); the details are in the server's log"
    else:
        detail = episode.error_message[-2000:]
    return EpisodeResult(episode_id=episode.episode_id, status=episode.status,
                         reward=episode.reward if ok else None, is_success=episode.is_success if ok else None,
                         role_rewards=dict(episode.role_rewards) if ok and episode.role_rewards else None,
                         reason=episode.reason, detail=detail)
