"""The batched multi-turn episode runner (docs/design.md §3.4, §5).

``EpisodeRunner.run(specs)`` plays many episodes of any registered envs at once: every turn, the prompts
of all live episodes go to the engine in one ``generate`` call; each completion is parsed and stepped by
its env; an episode stops when its env says done or at the turn limit.

**Training representation: segments.** An episode is recorded as one training sequence: the opening
prompt (system + first observation, masked) followed by the concatenated turns, the actor's generated ids
(mask 1) alternating with the observation turns the chat template wraps around them (mask 0). Because
ids are never re-tokenised, the sequence is exactly what the engine conditioned on at every turn, so one
forward pass scores every action of the episode. Only when the context outgrows its budget
(``context_tokens - max_new_tokens``) is a fresh, shorter prompt built (system + latest turns, see
``ChatBuilder.rebuild``) and a new segment started: an episode is a list of ``Segment``s, almost always
one. The actor loss treats the episode, not the segment, as the trajectory (``trainer.actor``).

**Seams for later issues.** Guided episodes get their experience from a ``retrieve`` callable, called
once per batch after the envs reset (the query needs the first observation); ``None`` (the grpo method)
means no retrieval. An ``intercept`` sees every turn's completions first: where it returns text, that text
is the observation of the turn and the env is not stepped (Search-and-Ask tool calls). An intercept that is
a collective over a torchrun group (``Intercept.collective``) is called on every rank for every turn that
any rank plays, with no states on a rank whose episodes have all ended.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from trainer import prompts
from trainer.cancel import CancelToken
from trainer.envs.base import TextEnv, make_env
from trainer.prompts import ChatBuilder, ContextOverflow, system_prompt
from trainer.rollout.base import Engine, Generation, GenerationRequest


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play."""

    env_name: str
    seed: int
    """The env instance (level/goal seed) within the runner's split."""
    group: int = 0
    """Task instance index within the batch: rollouts of the same instance share it (GRPO groups)."""
    guided: bool = False
    """Experience-guided rollout: ask ``retrieve`` for an experience to inject into the system prompt."""
    sample_seed: int | None = None
    """Base sampling seed; turn t samples with ``sample_seed + t`` (None: the engine's own RNG)."""


@dataclass(frozen=True)
class RetrievalQuery:
    """What a guided episode asks the experience store for, at its start (docs/design.md §3.3)."""

    env_name: str
    goal: str
    observation: str

    @property
    def text(self) -> str:
        return f"goal: {self.goal}, observation: {self.observation}"


@dataclass(frozen=True)
class Experience:
    """An experience injected into a guided episode's system prompt."""

    text: str
    entry_id: int | None = None
    """The bank entry it came from, for crediting its outcome later."""
    entry_version: int | None = None
    """The entry's version when it was retrieved: the outcome is credited to the generation that wrote
    this text, even if the entry has been rewritten by the time the credit is assigned."""
    similarity: float | None = None
    """Cosine similarity of the entry to the retrieval query (for reports on what was handed out)."""


Retriever = Callable[[Sequence[RetrievalQuery]], Sequence[Experience | None]]
"""Experience for each query (None: nothing found); called once per batch with every guided episode."""


class Intercept(Protocol):
    """Sees each turn's completions first (``states[i]`` wrote ``texts[i]``); a returned string is that
    episode's observation of the turn instead of an env step."""

    collective: bool
    """Joins collectives on every rank: the runner plays turns until every rank's episodes have ended."""

    def __call__(self, states: Sequence[EpisodeState], texts: Sequence[str]) -> list[str | None]: ...

    def offer(self, state: EpisodeState) -> str | None:
        """What the prompt says of the tool next to the episode's observation, now that it has played a turn
        (None: nothing there)."""
        ...


@dataclass
class Turn:
    """One actor turn, kept whole for the dashboard."""

    observation: str
    """What the actor saw before acting."""
    action_text: str
    """The completion as decoded text."""
    action: str | None
    """The parsed env action (None when unparseable, or when intercepted)."""
    reward: float
    invalid: bool
    done: bool
    num_tokens: int
    finish_reason: str
    weight_version: int
    intercepted: bool = False


@dataclass
class Segment:
    """One training sequence: ``prompt_ids`` then ``response_ids``; ``mask`` marks the actor's own ids."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    """1 on generated ids, 0 on observation / template ids; same length as ``response_ids``."""
    engine_logprobs: list[float] = field(default_factory=list)
    """The engine's logprob of each generated id (0.0 where mask is 0)."""

    @property
    def num_ids(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def num_trained(self) -> int:
        return sum(self.mask)


@dataclass
class Episode:
    """A finished episode: outcome, turns, training segments and provenance."""

    spec: EpisodeSpec
    goal: str
    system: str
    experience: Experience | None
    turns: list[Turn]
    segments: list[Segment]
    reward: float
    """Sum of the env's rewards (the outcome reward R(τ) for sparse envs)."""
    success: bool
    truncated: bool
    """Ended by the turn limit or the context budget rather than by the env."""
    weight_versions: list[int]
    """Distinct engine weight versions that generated this episode's actions."""
    wall_s: float

    @property
    def num_actions(self) -> int:
        return len(self.turns)

    @property
    def num_generated(self) -> int:
        return sum(t.num_tokens for t in self.turns)


@dataclass
class RolloutStats:
    """Timings and counts of one ``run`` call."""

    episodes: int = 0
    env_steps: int = 0
    generated_tokens: int = 0
    engine_calls: int = 0
    generate_s: float = 0.0
    env_s: float = 0.0
    retrieve_s: float = 0.0
    intercept_s: float = 0.0
    """In the intercept (Search-and-Ask), with the other ranks' waits of its collectives."""
    wall_s: float = 0.0
    played: int = 0
    """Episodes this process played itself (a rank of a torchrun group plays its share of ``episodes``)."""
    played_guided: int = 0
    """Of which experience-guided (``ShardedRunner``)."""

    def as_metrics(self, prefix: str = "rollout/") -> dict[str, float]:
        wall = max(self.wall_s, 1e-9)
        return {
            f"{prefix}time_s": self.wall_s,
            f"{prefix}generate_s": self.generate_s,
            f"{prefix}env_s": self.env_s,
            f"{prefix}retrieve_s": self.retrieve_s,
            f"{prefix}env_steps_per_s": self.env_steps / wall,
            f"{prefix}tokens_per_s": self.generated_tokens / wall,
            f"{prefix}generated_tokens": float(self.generated_tokens),
        }


class EpisodeState:
    """A live episode inside ``run``: its env, its chat ids and what has happened so far."""

    def __init__(
        self, spec: EpisodeSpec, env: TextEnv, observation: str, goal: str, position: int = 0
    ) -> None:
        self.spec = spec
        self.position = position
        """Where the spec stands in the whole batch (on one rank of several, in the group's batch)."""
        self.env = env
        self.observation = observation
        self.goal = goal
        self.system = ""
        self.experience: Experience | None = None
        self.turns: list[Turn] = []
        self.segments: list[Segment] = []
        self.history: list[tuple[str, str]] = []
        self.offer: str | None = None
        """What the intercept offers next to the current observation (``Intercept.offer``)."""
        self.offers: list[str | None] = []
        """What it offered next to each observation of ``history``, as the prompt showed it."""
        self.reward = 0.0
        self.success = False
        self.truncated = False
        self.done = False
        self.started = time.perf_counter()

    @property
    def segment(self) -> Segment:
        return self.segments[-1]

    @property
    def context_ids(self) -> list[int]:
        return self.segment.prompt_ids + self.segment.response_ids

    def finish(self) -> Episode:
        return Episode(
            spec=self.spec,
            goal=self.goal,
            system=self.system,
            experience=self.experience,
            turns=self.turns,
            segments=[s for s in self.segments if s.response_ids],
            reward=self.reward,
            success=self.success,
            truncated=self.truncated,
            weight_versions=sorted({t.weight_version for t in self.turns}),
            wall_s=time.perf_counter() - self.started,
        )


def _any_live(live: Sequence[EpisodeState], intercept: Intercept | None) -> bool:
    """Whether to play another turn: while any episode here is live, or, with a collective intercept, any
    rank's (a rank whose episodes have ended still joins the intercept's collectives)."""
    if intercept is None or not intercept.collective:
        return bool(live)
    from trainer import parallel  # torch.distributed: only where a run trains

    return parallel.any_rank(bool(live))


class EpisodeRunner:
    """Plays batches of episodes through one engine. Envs are pooled and reused across calls."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        split: str = "train",
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        turn_limit: int | None = None,
        context_tokens: int = 4096,
        cancel: CancelToken | None = None,
        experience_placement: str = "system",
    ) -> None:
        """``cancel``: checked before every turn (``trainer.cancel``). ``experience_placement``: where a
        guided episode's experience goes (``prompts.PLACEMENTS``)."""
        if experience_placement not in prompts.PLACEMENTS:
            raise ValueError(f"experience_placement must be one of {prompts.PLACEMENTS}")
        if context_tokens <= max_new_tokens:
            raise ValueError(
                f"context_tokens ({context_tokens}) must exceed max_new_tokens ({max_new_tokens})"
            )
        self.engine = engine
        self.chat = ChatBuilder(tokenizer)
        self.split = split
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.turn_limit = turn_limit
        self.context_tokens = context_tokens
        self.experience_placement = experience_placement
        self._pool: dict[str, list[TextEnv]] = defaultdict(list)
        self.cancel = cancel or CancelToken()

    @property
    def prompt_budget(self) -> int:
        """Most ids a prompt may hold so that a full-length completion still fits the context."""
        return self.context_tokens - self.max_new_tokens

    def run(
        self,
        specs: Sequence[EpisodeSpec],
        *,
        retrieve: Retriever | None = None,
        intercept: Intercept | None = None,
        temperature: float | None = None,
        progress: Callable[[int, int, int, int], None] | None = None,
        positions: Sequence[int] | None = None,
    ) -> tuple[list[Episode], RolloutStats]:
        """Play every spec to the end; episodes come back in the order of ``specs``. ``progress`` gets
        (episodes finished, episodes, turns played, the batch's turn limit) after every turn. ``positions``:
        where each spec stands in the group's batch (``ShardedRunner``); by default its place in ``specs``."""
        stats = RolloutStats(episodes=len(specs))
        start = time.perf_counter()
        temperature = self.temperature if temperature is None else temperature
        envs = self._acquire(specs)
        try:
            t0 = time.perf_counter()
            states = []
            places = range(len(specs)) if positions is None else positions
            for spec, env, place in zip(specs, envs, places, strict=True):
                obs, info = env.reset(spec.seed)
                states.append(EpisodeState(spec, env, obs, info.get("goal", env.goal), place))
            stats.env_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            self._inject_experience(states, retrieve)
            stats.retrieve_s = time.perf_counter() - t0
            for state in states:
                text = state.experience.text if state.experience else None
                state.system = system_prompt(
                    state.env, text if self.experience_placement == "system" else None
                )
                self._new_segment(state, [])
            live = [s for s in states if not s.done]
            turns, turn = self._turn_budget(live), 0
            while _any_live(live, intercept):
                self.cancel.check()
                self._turn(live, stats, intercept, temperature)
                live, turn = [s for s in live if not s.done], turn + 1
                if progress is not None:
                    progress(len(states) - len(live), len(states), turn, max(turns, turn))
        finally:
            self._release(specs, envs)
        stats.wall_s = time.perf_counter() - start
        return [s.finish() for s in states], stats

    def _turn_budget(self, states: list[EpisodeState]) -> int:
        """The most turns any of ``states`` may take: its env's limit, or the runner's if lower."""
        limits = [min(s.env.max_turns, self.turn_limit or s.env.max_turns) for s in states]
        return max(limits, default=0)

    # ---- phases of a batch -------------------------------------------------------------------

    def _inject_experience(self, states: list[EpisodeState], retrieve: Retriever | None) -> None:
        guided = [s for s in states if s.spec.guided]
        if retrieve is None or not guided:
            return
        found = retrieve([RetrievalQuery(s.spec.env_name, s.goal, s.observation) for s in guided])
        if len(found) != len(guided):
            raise ValueError(f"retrieve returned {len(found)} experiences for {len(guided)} queries")
        for state, experience in zip(guided, found, strict=True):
            state.experience = experience

    def _turn(
        self, live: list[EpisodeState], stats: RolloutStats, intercept: Intercept | None, temperature: float
    ) -> None:
        requests = [
            GenerationRequest(
                prompt_ids=tuple(s.context_ids),
                max_new_tokens=self.max_new_tokens,
                temperature=temperature,
                top_p=self.top_p,
                seed=None if s.spec.sample_seed is None else s.spec.sample_seed + len(s.turns),
            )
            for s in live
        ]
        t0 = time.perf_counter()
        generations = self.engine.generate(requests) if requests else []
        stats.generate_s += time.perf_counter() - t0
        stats.engine_calls += bool(requests)
        t0 = time.perf_counter()
        tool_observations: list[str | None] = [None] * len(live)
        if intercept is not None:
            t1 = time.perf_counter()
            tool_observations = intercept(live, [gen.text for gen in generations])
            stats.intercept_s += time.perf_counter() - t1
            t0 += time.perf_counter() - t1  # env_s is the envs' time alone
        for state, gen, tool_obs in zip(live, generations, tool_observations, strict=True):
            self._play(state, gen, tool_obs, stats)
            if not state.done:
                state.offer = intercept.offer(state) if intercept is not None else None
                self._append_observation(state, state.observation, gen.token_ids)
        stats.env_s += time.perf_counter() - t0

    def _play(self, state: EpisodeState, gen: Generation, tool_obs: str | None, stats: RolloutStats) -> None:
        """One episode's turn: its completion appended, the env stepped (or the intercept's text taken as the
        observation), the turn recorded."""
        seg = state.segment
        seg.response_ids += gen.token_ids
        seg.mask += [1] * len(gen.token_ids)
        seg.engine_logprobs += gen.logprobs
        stats.generated_tokens += len(gen.token_ids)
        if tool_obs is not None:
            obs, reward, done, info = tool_obs, 0.0, False, {}
        else:
            obs, reward, done, info = state.env.step(gen.text)
            stats.env_steps += 1
        state.turns.append(
            Turn(
                observation=state.observation,
                action_text=gen.text,
                action=None if tool_obs is not None else state.env.parse_action(gen.text),
                reward=float(reward),
                invalid=bool(info.get("invalid_action", False)),
                done=bool(done),
                num_tokens=len(gen.token_ids),
                finish_reason=gen.finish_reason,
                weight_version=gen.weight_version,
                intercepted=tool_obs is not None,
            )
        )
        state.history.append((state.observation, prompts.answer_prefix(state.env) + gen.text))
        state.offers.append(state.offer)
        state.reward += float(reward)
        state.success = bool(info.get("success", False))
        state.truncated = bool(info.get("truncated", False))
        if not done and self.turn_limit is not None and len(state.turns) >= self.turn_limit:
            done, state.truncated = True, True
        state.observation = obs
        state.done = bool(done)

    def _append_observation(self, state: EpisodeState, obs: str, action_ids: Sequence[int]) -> None:
        seg = state.segment
        turn_ids = self.chat.observation_turn(
            self._user(state, obs, state.offer), action_ids, prompts.answer_prefix(state.env)
        )
        if seg.num_ids + len(turn_ids) <= self.prompt_budget:
            seg.response_ids += turn_ids
            seg.mask += [0] * len(turn_ids)
            seg.engine_logprobs += [0.0] * len(turn_ids)
            return
        # Over budget: start a new segment from a fresh prompt of at most half the budget, so that a
        # rebuild happens once every several turns rather than every turn.
        self._new_segment(state, state.history, budget=self.prompt_budget // 2)

    def _user(self, state: EpisodeState, observation: str, offer: str | None) -> str:
        """An observation turn's text, with the episode's experience when it is placed in every turn and what
        the intercept offered there."""
        turn = self.experience_placement == "turn" and state.experience is not None
        extra = ([state.experience.text] if turn else []) + ([offer] if offer else [])
        return prompts.user_message(observation, state.env, "\n\n".join(extra) or None)

    def _new_segment(self, state: EpisodeState, history: Sequence[tuple[str, str]], budget: int = 0) -> None:
        """Start a training segment: the opening prompt, or (``history`` given) a rebuilt one of at most
        ``budget`` ids, or of at most the whole prompt budget when not even the latest turn fits that."""
        observation = self._user(state, state.observation, state.offer)
        shown = [
            (self._user(state, obs, offer), action)
            for (obs, action), offer in zip(history, state.offers, strict=True)
        ]
        ids = None
        for limit in dict.fromkeys((budget or self.prompt_budget, self.prompt_budget)):
            try:
                ids, _ = self.chat.rebuild(
                    state.system, shown, observation, limit, state.goal, prompts.answer_prefix(state.env)
                )
                break
            except ContextOverflow:
                continue
        if ids is None:
            # Nothing fits: end the episode as a failure rather than overflow the engine's context.
            state.done, state.truncated = True, True
            if not state.segments:
                state.segments.append(Segment(prompt_ids=[]))
            return
        state.segments.append(Segment(prompt_ids=ids))

    # ---- env pool ----------------------------------------------------------------------------

    def _acquire(self, specs: Sequence[EpisodeSpec]) -> list[TextEnv]:
        envs = []
        for spec in specs:
            pool = self._pool[spec.env_name]
            envs.append(pool.pop() if pool else make_env(spec.env_name, split=self.split))
        return envs

    def _release(self, specs: Sequence[EpisodeSpec], envs: Sequence[TextEnv]) -> None:
        for spec, env in zip(specs, envs, strict=True):
            self._pool[spec.env_name].append(env)

    def close(self) -> None:
        """Close every pooled env (the engine belongs to the caller)."""
        for pool in self._pool.values():
            for env in pool:
                env.close()
        self._pool.clear()


class ShardedRunner:
    """An ``EpisodeRunner`` for one rank of a torchrun group (``trainer.parallel``): each rank plays the
    specs it owns (``parallel.owners``: its share of the guided and of the free ones) on its own engine,
    then the episodes are gathered so that every rank holds the whole batch, in the order of ``specs``. A
    spec carries its sample seed, so where an episode is played does not change it.

    Retrieval is a collective (``parallel.on_rank_zero``): once every rank has reset its envs, the guided
    episodes' queries are gathered in the order of ``specs``, rank 0's ``retrieve`` (the bank) answers them in
    one call, the very call one process makes, and each rank injects its own answers; a rank without a
    guided episode joins with none. So the bank is read and written by rank 0 alone, and a run gets the same
    experiences on any number of ranks (docs/design.md §7). A collective ``intercept`` (Search-and-Ask) is
    called every turn on every rank, with each episode's place in ``specs``. One process: the inner runner
    as is."""

    def __init__(self, inner: EpisodeRunner) -> None:
        self.inner = inner

    def run(self, specs: Sequence[EpisodeSpec], **options: Any) -> tuple[list[Episode], RolloutStats]:
        """``EpisodeRunner.run`` over the whole group. The stats are this rank's, but for ``episodes``."""
        from trainer import parallel  # torch.distributed: only where a run trains

        owned_by = parallel.owners([s.guided for s in specs])
        rank = parallel.rank()
        mine = [s for s, r in zip(specs, owned_by, strict=True) if r == rank]
        retrieve = options.get("retrieve")
        guided_by = [r for s, r in zip(specs, owned_by, strict=True) if s.guided]
        if retrieve is not None and guided_by:
            options["retrieve"] = partial(parallel.on_rank_zero, owned_by=guided_by, serve=retrieve)
            if rank not in guided_by:  # every rank joins the collective, with its queries or with none
                parallel.on_rank_zero([], guided_by, retrieve)
        options["positions"] = [i for i, r in enumerate(owned_by) if r == rank]
        episodes, stats = self.inner.run(mine, **options)
        stats.played, stats.episodes = stats.episodes, len(specs)
        stats.played_guided = sum(s.guided for s in mine)
        return parallel.gather_owned(episodes, owned_by), stats

    def close(self) -> None:
        self.inner.close()
