"""OpenEnv (openenv-core 0.3), a counting game: the observation shows the last number; the action
says the next one. A right number scores 1, a wrong one 0; the game is done at `target` (the
reset's `target`, default 3) right numbers. The reset's seed is the first number. Saying "crash"
raises in the environment; "garble" returns a reward that is no number (the server refuses to send
it: an execution error)."""

from uuid import uuid4

from openenv.core.env_server import Environment, create_app
from openenv.core.env_server.types import Action, Observation, State


class CountAction(Action):
    message: str


class CountObservation(Observation):
    last: int = 0
    text: str = ""


class CountEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.last, self.right, self.target = 0, 0, 3

    def reset(self, seed=None, episode_id=None, target: int = 3, **kwargs) -> CountObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.last, self.right, self.target = int(seed or 0), 0, int(target)
        return CountObservation(last=self.last, text=f"The number is {self.last}. Say the next one.")

    def step(self, action: CountAction, timeout_s=None, **kwargs) -> CountObservation:
        self._state.step_count += 1
        if action.message.strip() == "crash":
            raise RuntimeError("the counting game crashed")
        ok = action.message.strip() == str(self.last + 1)
        if ok:
            self.last += 1
            self.right += 1
        return CountObservation(last=self.last, text=f"The number is {self.last}. Say the next one.",
                                reward=1.0 if ok else 0.0, done=self.right >= self.target)

    @property
    def state(self) -> State:
        return self._state


app = create_app(CountEnv, CountAction, CountObservation, env_name="count", max_concurrent_envs=8)
