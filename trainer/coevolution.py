"""Complementary RL: the actor's loop with the experience bank and the extractor's background track
(docs/design.md §3.4, §3.5). One code path for every method; the config's derived switches decide what runs:

| method          | actor trains | extractor trains | experience used |
| grpo            | yes          | no               | never (plain ``TrainingLoop``)  |
| static_online   | yes          | no (frozen πϕ keeps the bank online) | yes |
| exp_only        | no           | yes              | yes |
| complementary   | yes          | yes              | yes |

``CoevolutionLoop`` is the actor's ``TrainingLoop`` with three seams filled:

- ``retrieve``: guided rollouts get the top-1 entry of their scope (``BankRetriever``); during the first
  ``experience.warmup_steps`` actor steps nothing is retrieved and the bank fills from distillation;
- an intercept (``SearchAndAsk``): a guided episode may write ``<search>question</search>`` (at most
  ``experience.search_and_ask_max`` times); the runner does not step the env, the store retrieves and πϕ
  refines, and the answer is the next observation (masked out of the actor's loss like every observation);
- right after each rollout the episodes go to the ``ExtractorTrack`` (distillation, credit, CISPO), which
  works on its own thread while the actor updates: the actor never waits for it. Merges are requested
  every ``experience.merge_every`` steps.

Evaluation reports both columns, with and without experience (``trainer.evaluate``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer import parallel
from trainer.checkpoint import read_track_state
from trainer.config import ConfigError, RunConfig
from trainer.envs.base import make_mixture
from trainer.extractor.credit import CreditBuffer
from trainer.extractor.model import DistilRequest, Extractor
from trainer.extractor.prompts import Step
from trainer.extractor.track import Credit, ExtractorTrack, TrackJournal
from trainer.extractor.update import ExtractorUpdate
from trainer.loop import TrainingLoop
from trainer.metrics import Metrics
from trainer.report import BaseReporter, Progress, Reporter, report_eval_episodes, report_progress
from trainer.rollout.runner import Episode, EpisodeSpec, EpisodeState, Experience, RetrievalQuery
from trainer.runfiles import last_attempt, read_lines
from trainer.store import SHARED_SCOPE, Entry, ExperienceStore, Generation, Refinement

_ASK = "If you are unsure what to do, you may ask the experience bank instead of acting: reply with "
_LIMIT = " At most {limit} questions per episode."
TOOL_NOTES = {
    "plain": _ASK + "<search>your question</search>." + _LIMIT,
    "example": _ASK
    + "<search>your question</search>, for example <search>Which way are the stairs?</search>."
    + _LIMIT,
}
"""What a guided episode's prompt says of Search-and-Ask after its experience (``experience.tool_note``)."""
JOURNAL_FILE = "extractor_track.jsonl"
"""The extractor track's finished work, in the run's folder (``trainer.extractor.track.TrackJournal``)."""
METRICS_FILE = "metrics.jsonl"
"""The run's step and eval rows, in its folder (``trainer.report.JsonlReporter``)."""
SEARCH_TAG = re.compile(r"<search>(.*?)(?:</search>|$)", re.DOTALL | re.IGNORECASE)


STUCK = "That changed nothing. "
"""Opens the note where the tool is offered at a stuck point (``experience.tool_offer`` 'stuck')."""


def tool_note(cfg: RunConfig) -> str:
    """What a guided episode's prompt says of Search-and-Ask ("" when it is off)."""
    limit = cfg.search_and_ask_limit
    return TOOL_NOTES[cfg.experience.tool_note].format(limit=limit) if limit else ""


def changed_nothing(state: EpisodeState) -> bool:
    """The episode's last turn left it stuck: an invalid action, or an observation it had seen before in the
    episode (a move into a wall, back and forth). A turn the tool answered is not one."""
    if not state.turns or state.turns[-1].intercepted:
        return False
    return state.turns[-1].invalid or state.observation in (t.observation for t in state.turns)


def scope_for(cfg: RunConfig, env_name: str) -> str:
    """The bank scope an env retrieves from and distils into."""
    return SHARED_SCOPE if cfg.experience.scope == "shared" else env_name


def scopes_of(cfg: RunConfig) -> list[str]:
    return list(dict.fromkeys(scope_for(cfg, name) for name in make_mixture(cfg.env).names))


def episode_id(tag: str, spec: EpisodeSpec) -> str:
    """A run-unique id of an episode: its step tag and what makes it distinct within the step."""
    return f"{tag}/{spec.env_name}/{spec.seed}/{spec.group}/{spec.sample_seed}"


def on_trace(reporter: Reporter, step: int, trace: Mapping[str, Any]) -> None:
    """Hand a Search-and-Ask trace to reporters that take traces (``on_trace``); others skip it."""
    hook = getattr(reporter, "on_trace", None)
    if hook is not None:
        hook(step, trace)


class BankRetriever:
    """The runner's ``Retriever`` over an experience store: top-k of each query's scope, or nothing while
    ``active`` is False (warm-up). Remembers the entries it handed out, for distillation (``Update``)."""

    def __init__(
        self, store: ExperienceStore, cfg: RunConfig, *, tool_note: str = "", count: bool = True
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.tool_note = tool_note
        self.count = count
        """Record retrievals in the entries' usage counters; False for evaluation, which must not steer
        what training retrieves next (the diversified re-rank reads those counters)."""
        self.active = True
        self.entries: dict[int, Entry] = {}
        self.seconds = 0.0
        self.queries = 0

    def __call__(self, queries: Sequence[RetrievalQuery]) -> list[Experience | None]:
        if not self.active:
            return [None] * len(queries)
        t0 = time.perf_counter()
        by_scope: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            by_scope.setdefault(scope_for(self.cfg, q.env_name), []).append(i)
        found: list[list[Entry]] = [[] for _ in queries]
        for scope, idx in by_scope.items():
            texts = [queries[i].text for i in idx]
            results = self.store.retrieve(texts, scope, k=self.cfg.experience.top_k, count=self.count)
            for i, entries in zip(idx, results, strict=True):
                found[i] = entries
        out: list[Experience | None] = []
        for entries in found:
            for e in entries:
                self.entries[e.id] = e
            parts = [e.text for e in entries] + ([self.tool_note] if self.tool_note else [])
            top = entries[0] if entries else None
            out.append(
                Experience(
                    "\n\n".join(parts),
                    top.id if top else None,
                    top.version if top else None,
                    top.similarity if top else None,
                )
                if parts
                else None
            )
        self.seconds += time.perf_counter() - t0
        self.queries += len(queries)
        return out


@dataclass(frozen=True)
class Ask:
    """A completion that asks the bank: the question, its scope, and where and when it was asked."""

    spec: EpisodeSpec
    position: int
    """The episode's place in the group's batch: rank 0 serves every rank's asks of a turn in this order."""
    turn: int
    query: str
    scope: str


@dataclass(frozen=True)
class Answer:
    entry: Entry | None
    refinement: Refinement


class SearchAndAsk:
    """The runner's intercept for Search-and-Ask (docs/design.md §3.3): see the module docstring.

    On every rank of a torchrun group, each turn (a collective, ``Intercept.collective``): a rank finds the
    asks among its own episodes' completions, rank 0 searches the bank for every rank's asks of the turn in
    the batch's order (the very calls one process makes), each rank's πϕ engine refines its own asks' entries
    (under the same weight-version check), and rank 0 records every exchange once, in the same order, and
    sends its trace. ``store`` is rank 0's; a helper rank passes None."""

    collective = True

    def __init__(
        self, store: ExperienceStore | None, extractor: Extractor, cfg: RunConfig, reporter: Reporter | None
    ) -> None:
        self.store = store
        self.extractor = extractor
        self.cfg = cfg
        self.reporter = reporter
        self.limit = cfg.search_and_ask_limit
        self.step = 0
        self.refinements: dict[str, list[Generation]] = {}
        """Refinement generations per episode id (every rank's, on rank 0), credited by the outcome."""
        self.exchanges = 0
        self.seconds = 0.0

    def __call__(self, states: Sequence[EpisodeState], texts: Sequence[str]) -> list[str | None]:
        t0 = time.perf_counter()
        asks = [self._ask(state, text) for state, text in zip(states, texts, strict=True)]
        mine = [a for a in asks if a is not None]
        owned_by = [r for _, r in sorted(
            (position, r) for r, part in enumerate(parallel.gather_values([a.position for a in mine]))
            for position in part
        )]  # fmt: skip
        if not owned_by:  # no rank asked this turn
            return [None] * len(states)
        found = parallel.on_rank_zero(mine, owned_by, self._search)
        answers = [Answer(e, self.extractor.refine_fn(a.query, e)) for a, e in zip(mine, found, strict=True)]
        parallel.on_rank_zero(list(zip(mine, answers, strict=True)), owned_by, self._record)
        self.seconds += time.perf_counter() - t0
        told = iter(
            f"Experience bank answer to '{a.query[:200]}':\n{r.refinement.text}"
            for a, r in zip(mine, answers, strict=True)
        )
        return [None if a is None else next(told) for a in asks]

    def offer(self, state: EpisodeState) -> str | None:
        """With ``experience.tool_offer`` 'stuck': the tool's note next to an observation where a guided
        episode that may still ask is stuck (``changed_nothing``)."""
        if self.cfg.experience.tool_offer != "stuck" or not self._may_ask(state):
            return None
        return STUCK + tool_note(self.cfg) if changed_nothing(state) else None

    def _may_ask(self, state: EpisodeState) -> bool:
        asked = sum(t.intercepted for t in state.turns)
        return state.spec.guided and state.experience is not None and asked < self.limit

    def _ask(self, state: EpisodeState, text: str) -> Ask | None:
        """The ask in a completion, if it is one and the episode may still ask."""
        match = SEARCH_TAG.search(text)
        if match is None or not self._may_ask(state):
            return None  # over the limit, say: the text goes to the env as an action
        query = match.group(1).strip() or state.goal
        scope = scope_for(self.cfg, state.spec.env_name)
        return Ask(state.spec, state.position, len(state.turns), query, scope)

    def _search(self, asks: Sequence[Ask]) -> list[Entry | None]:
        """Rank 0: the best entry for each ask, in the batch's order."""
        assert self.store is not None, "Search-and-Ask searches on rank 0, which holds the store"
        return [next(iter(self.store.retrieve([a.query], a.scope, k=1)[0]), None) for a in asks]

    def _record(self, exchanges: Sequence[tuple[Ask, Answer]]) -> list[int]:
        """Rank 0: every exchange recorded once and traced; its refinement kept for credit."""
        assert self.store is not None, "Search-and-Ask records on rank 0, which holds the store"
        ids = []
        for ask, answer in exchanges:
            ep = episode_id(str(self.step), ask.spec)
            entry, refinement = answer.entry, answer.refinement
            exchange_id = self.store.record_ask(
                ask.query, ask.scope, entry, refinement, episode_id=ep, step=self.step
            )
            self.exchanges += 1
            if refinement.generation is not None:
                self.refinements.setdefault(ep, []).append(refinement.generation)
            version = (
                refinement.generation.weight_version
                if refinement.generation
                else self.extractor.expected_version
            )
            on_trace(self.reporter, self.step, {
                "kind": "search_and_ask", "exchange_id": exchange_id, "episode_id": ep, "turn": ask.turn,
                "query": ask.query, "entry_id": entry.id if entry else None,
                "entry_title": entry.title if entry else "", "answer": refinement.text,
                "extractor_version": version,
            })  # fmt: skip
            ids.append(exchange_id)
        return ids


class _Runner:
    """The loop's runner with the Search-and-Ask intercept and a hook that sees each finished batch."""

    def __init__(self, inner: Any, intercept: SearchAndAsk | None, on_batch: Any) -> None:
        self.inner = inner
        self.intercept = intercept
        self.on_batch = on_batch

    def run(self, specs: Sequence[EpisodeSpec], **options: Any):
        if self.intercept is not None:
            options.setdefault("intercept", self.intercept)
        episodes, stats = self.inner.run(specs, **options)
        self.on_batch(episodes)
        return episodes, stats

    def close(self) -> None:
        self.inner.close()


class _Reporter(BaseReporter):
    """Adds the extractor track's metrics to every step report; passes everything through."""

    def __init__(self, inner: Reporter, loop: CoevolutionLoop) -> None:
        self.inner = inner
        self.loop = loop

    def on_start(self, total_steps: int, start_step: int) -> None:
        self.inner.on_start(total_steps, start_step)

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self.inner.on_step(step, {**metrics, **self.loop.experience_metrics()})

    def on_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        self.inner.on_eval(step, metrics)

    def on_episode_batch(self, step: int, episodes: Sequence[Episode]) -> None:
        self.inner.on_episode_batch(step, episodes)

    def on_trace(self, step: int, trace: Mapping[str, Any]) -> None:
        on_trace(self.inner, step, trace)

    def on_progress(self, step: int, progress: Mapping[str, Any]) -> None:
        report_progress(self.inner, step, progress)

    def on_eval_episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        report_eval_episodes(self.inner, step, episodes)

    def should_stop(self) -> bool:
        return self.inner.should_stop()


@dataclass
class CoevolutionLoop(TrainingLoop):
    """``TrainingLoop`` plus the experience machinery (see the module docstring)."""

    store: ExperienceStore | None = None
    extractor: Extractor | None = None
    extractor_update: ExtractorUpdate | None = None
    """None when πϕ is frozen (static_online)."""
    track: ExtractorTrack = field(init=False)
    last_train: Metrics = field(init=False, default_factory=dict)
    held: tuple[Sequence[DistilRequest], Sequence[Credit]] = field(init=False, default=((), ()))
    """A step's distillation requests and credits, held until after the actor's update in lockstep."""

    def __post_init__(self) -> None:
        cfg = self.cfg
        if self.store is None or self.extractor is None:
            raise ConfigError(f"method {cfg.method!r} needs an experience store and an extractor")
        super().__post_init__()
        self.reporter = _Reporter(self.reporter, self)
        self.step = 0
        limit = cfg.search_and_ask_limit
        self.tool = SearchAndAsk(self.store, self.extractor, cfg, self.reporter) if limit else None
        always = cfg.experience.tool_offer == "always"
        self.retriever = BankRetriever(self.store, cfg, tool_note=tool_note(cfg) if always else "")
        self.retrieve = self.retriever
        self.eval_retrieve = BankRetriever(self.store, cfg, count=False)
        self.runner = _Runner(self.runner, self.tool, self._submit)
        buffer = CreditBuffer(
            cfg.extractor.buffer_size,
            delta=cfg.extractor.delta,
            alpha=cfg.extractor.alpha,
            reweight=cfg.reweights,
        )
        self.track = ExtractorTrack(
            self.extractor,
            self.store,
            buffer,
            scopes=scopes_of(cfg),
            update=self.extractor_update,
            warmup_steps=cfg.experience.warmup_steps,
            cancel=self.cancel,
            journal=Path(self.out_dir) / JOURNAL_FILE,
            progress=Progress(self.reporter, track="extractor"),
            trains_here=not shares_extractor(self.extractor_update),
        )

    def run(self) -> Metrics:
        try:
            last = super().run()
            if self.cancelled:
                return last
            if shares_extractor(self.extractor_update):  # the other ranks train πϕ's last batches too
                extractor_rounds(self.extractor_update, self.extractor, self.track, final=True)
            else:
                self.track.drain()
            if self.start_step > self.cfg.steps:  # resumed after its last step, for the track's work only
                self._report_last_row_again()
            elif self.last_train:  # the last step's row again, with the extractor's work on it finished
                self.reporter.on_step(self.step, self.last_train)
            return last | self.experience_metrics()
        finally:
            self.track.close(timeout=5 if self.cancelled else 60)

    def train_step(self, step: int) -> Metrics:
        self.step = step
        self.retriever.active = step > self.cfg.experience.warmup_steps
        if self.tool is not None:
            self.tool.step = step
        metrics = self.last_train = super().train_step(step)
        if self.cfg.experience.lockstep:
            self._track_in_lockstep(step)
            return metrics
        extractor_rounds(self.extractor_update, self.extractor, self.track, final=False)
        if self.cfg.merges and step % self.cfg.experience.merge_every == 0:
            self.track.request_merge(step)
        return metrics

    def _track_in_lockstep(self, step: int) -> None:
        """``experience.lockstep``: the step's work in one order whatever the placement, each part finished
        before the next: credit (and πϕ's updates on full buffers), then distillation with the updated πϕ,
        then a due merge. (Asynchronous, one process trains on the track's thread before distilling, a
        sharded πϕ after the actor's update, while distillation runs: the same run, other πϕ samples.)"""
        requests, credits = self.held
        self.held = ((), ())
        self.track.submit(step, (), credits)
        self._wait_for_track()
        self.track.submit(step, requests, ())
        if self.cfg.merges and step % self.cfg.experience.merge_every == 0:
            self.track.request_merge(step)
        self._wait_for_track()

    def _wait_for_track(self) -> None:
        """Until the track has done everything queued; a sharded πϕ trains in rounds with the other ranks
        meanwhile (each call is one ``extractor_rounds`` for them: ``HelperRankLoop.train_step``)."""
        if shares_extractor(self.extractor_update):
            extractor_rounds(self.extractor_update, self.extractor, self.track, final=True)
            return
        while not self.track.drain(timeout=1.0):
            self.cancel.check()

    def _submit(self, episodes: Sequence[Episode]) -> None:
        """Right after a training rollout: distillation requests and credits to the background track."""
        requests, credits = [], []
        for e in episodes:
            ep = episode_id(str(self.step), e.spec)
            entry_id = e.experience.entry_id if e.experience else None
            entry_version = e.experience.entry_version if e.experience else None
            requests.append(
                DistilRequest(
                    episode_id=ep,
                    scope=scope_for(self.cfg, e.spec.env_name),
                    goal=e.goal,
                    steps=tuple(Step(t.observation, t.action_text) for t in e.turns),
                    success=e.success,
                    reward=e.reward,
                    retrieved=self.retriever.entries.get(entry_id) if entry_id is not None else None,
                    step=self.step,
                )
            )
            refinements = self.tool.refinements.pop(ep, []) if self.tool else []
            if entry_id is not None or refinements:
                credits.append(Credit(ep, e.success, entry_id=entry_id, entry_version=entry_version))
            credits += [Credit(ep, e.success, generation=g) for g in refinements]
        requests = requests if self.cfg.distils else []
        if self.cfg.experience.lockstep:
            self.held = (requests, credits)
            return
        self.track.submit(self.step, requests, credits)

    def _report_last_row_again(self) -> None:
        """The last step's row as the lost attempt wrote it, with the extractor's figures now that its work
        is done (the actor's and the retriever's stay as they were); nothing without a metrics file."""
        rows = last_attempt(read_lines(Path(self.out_dir) / METRICS_FILE))
        last = [r for r in rows if r.get("kind") == "step" and r.get("step") == self.cfg.steps]
        if last:
            row = {k: v for k, v in last[-1].items() if k not in ("kind", "step", "time")}
            self.reporter.inner.on_step(self.cfg.steps, row | self.track.metrics())

    def experience_metrics(self) -> Metrics:
        metrics = self.track.metrics()
        metrics["experience/retrieve_s"] = self.retriever.seconds
        metrics["experience/retrieval_active"] = float(self.retriever.active)
        if self.tool is not None:
            metrics["experience/search_and_ask"] = float(self.tool.exchanges)
            metrics["experience/search_and_ask_s"] = self.tool.seconds
        return metrics


class RankZeroBank:
    """A helper rank's retriever in a multi-process run that uses experience: the bank is rank 0's, and a
    helper rank's guided episodes get their experiences through ``ShardedRunner``'s collective, in which
    rank 0's retriever answers every rank's queries (``parallel.on_rank_zero``), so this one is never
    called. Passing it makes a helper rank join every retrieval and play both evaluation columns with
    rank 0."""

    def __call__(self, queries: Sequence[RetrievalQuery]) -> list[Experience | None]:
        raise RuntimeError("a helper rank was asked to retrieve: the bank answers on rank 0 alone")


@dataclass
class HelperRankLoop(TrainingLoop):
    """Ranks 1..N-1 of a multi-process run that uses experience (docs/design.md §7): the actor's loop,
    making the same collectives as rank 0's ``CoevolutionLoop`` (retrievals, rollout gathers, sharded
    updates and syncs of both models, both evaluation columns, checkpoints) while playing the guided and
    free episodes it owns. The bank and the extractor track live on rank 0 alone, so entries are retrieved,
    credited, distilled and written once (this rank's Search-and-Ask questions are searched and recorded
    there too; its own πϕ engine refines their answers); this rank trains its shards of πϕ on the batches
    rank 0 hands out, and reports nothing."""

    extractor: Extractor | None = None
    """πϕ over this rank's engine, synced with rank 0's: it refines this rank's Search-and-Ask answers."""
    extractor_update: ExtractorUpdate | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.retrieve = self.eval_retrieve = RankZeroBank()
        if self.cfg.search_and_ask_limit:  # this rank's asks: rank 0 searches and records, πϕ here refines
            assert self.extractor is not None, "a helper rank of a run with Search-and-Ask needs πϕ"
            tool = SearchAndAsk(None, self.extractor, self.cfg, None)
            self.runner = _Runner(self.runner, tool, lambda episodes: None)

    def run(self) -> Metrics:
        last = super().run()
        if not self.cancelled:
            extractor_rounds(self.extractor_update, self.extractor, None, final=True)
        return last

    def train_step(self, step: int) -> Metrics:
        metrics = super().train_step(step)
        for _ in range(2 if self.cfg.experience.lockstep else 1):  # as rank 0's loop: credit, then distil
            extractor_rounds(self.extractor_update, self.extractor, None, final=False)
        return metrics


ROUND_S = 30.0
"""How long rank 0 drains its extractor track between two rounds at the end of a run whose πϕ is sharded:
the other ranks wait in each round's broadcast, never near a collective's time-out."""


def shares_extractor(update: ExtractorUpdate | None) -> bool:
    """πϕ trains sharded over the torchrun group: its updates are collectives every rank joins."""
    return update is not None and parallel.trains_together(update.model)


def extractor_rounds(
    update: ExtractorUpdate | None, extractor: Extractor, track: ExtractorTrack | None, *, final: bool
) -> None:
    """The updates of a sharded πϕ (nothing otherwise): rank 0 (``track`` given) hands its full credit
    buffers to every rank, and all train on them together (CISPO step and sync are collectives). One round
    after each actor step; at the end (``final``) rounds until rank 0's track has drained."""
    if not shares_extractor(update):
        return
    done = False
    while not done:
        if track is None:
            batches, done = parallel.broadcast_object(None)
            for batch in batches:
                update.train(batch, extractor)
            continue
        drained = not final or track.drain(timeout=ROUND_S)
        with track.update_lock:  # no checkpoint between taking a batch and training on it
            batches, done = parallel.broadcast_object((track.take_ready(), drained))
            for batch in batches:
                track.train(batch)


def work_left(out_dir: Path, checkpoint: Path) -> bool:
    """Whether a checkpoint holds extractor work that the lost attempt did not finish after it (credits to
    settle, items its journal in ``out_dir`` does not list): a run that died after its last step must still
    be resumed to do it."""
    state = read_track_state(checkpoint)
    if state is None:
        return False
    done = TrackJournal(Path(out_dir) / JOURNAL_FILE).done
    return bool(state.get("pending_credits")) or any(i.key not in done for i in state.get("unfinished", []))
