"""The extractor πϕ at inference: its three jobs as batched engine calls, with every answer kept as a
``Generation`` (prompt, response ids, old log-probs, weight version) for credit assignment
(docs/design.md §3.2).

``Extractor.distil`` turns finished episodes into store operations; ``Extractor.merge_fn`` is the store's
``MergeFn`` and ``Extractor.refine_fn`` answers Search-and-Ask (``trainer.coevolution.SearchAndAsk``).
Structured outputs (a JSON schema per job) are used when the engine supports them (vLLM); the parsers are
lenient either way, and every unparseable answer is counted in ``Extractor.stats`` rather than raised.

The actor's and the extractor's in-process vLLM engines never run a step at the same time (the vLLM
backend serialises its calls process-wide): a call waits for at most one batch of the other model, never
for a queue of work.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from trainer.extractor import parsing
from trainer.extractor import prompts as xp
from trainer.rollout.base import Engine, GenerationRequest
from trainer.store import Add, Entry, Generation, MergePlan, Op, Refinement, Return, Update


class StaleExtractorError(RuntimeError):
    """The extractor engine serves other weights than the trainer last synced to it."""


@dataclass(frozen=True)
class DistilRequest:
    """A finished episode queued for distillation."""

    episode_id: str
    scope: str
    goal: str
    steps: tuple[xp.Step, ...]
    success: bool
    reward: float
    retrieved: Entry | None = None
    """The entry that guided the episode (an ``update`` rewrites it), or None."""
    step: int = 0
    """The actor step the episode belongs to."""


@dataclass
class DistilResult:
    request: DistilRequest
    generation: Generation
    ops: list[Op]
    """Store operations (Add / Update / Return) carrying ``generation``; empty when unparseable."""
    parsed: parsing.Parsed


@dataclass
class ExtractorStats:
    """Counters of the extractor's calls, answers and parse failures, by job."""

    calls: Counter = field(default_factory=Counter)
    unparseable: Counter = field(default_factory=Counter)
    dropped_items: Counter = field(default_factory=Counter)
    repaired: Counter = field(default_factory=Counter)
    ops: Counter = field(default_factory=Counter)
    tokens: Counter = field(default_factory=Counter)
    """Generated tokens by job: the extractor's inference compute."""
    failure_log: Path | None = None
    """A JSONL file that gets every unparseable answer whole, with why (a run's ``FAILURES_FILE``)."""

    COUNTERS: ClassVar[tuple[str, ...]] = (
        "calls",
        "unparseable",
        "dropped_items",
        "repaired",
        "ops",
        "tokens",
    )
    """The fields a checkpoint keeps (a resumed run counts on from them)."""

    def record(self, job: str, parsed: parsing.Parsed, raw: str, tokens: int = 0) -> None:
        self.calls[job] += 1
        self.tokens[job] += tokens
        self.dropped_items[job] += len(parsed.errors) if parsed.ok else 0
        self.repaired[job] += parsed.repaired
        if not parsed.ok:
            self.unparseable[job] += 1
            self._log_failure(job, parsed, raw, tokens)

    def state_dict(self) -> dict[str, dict[str, int]]:
        """The counters, for a checkpoint."""
        return {name: dict(getattr(self, name)) for name in self.COUNTERS}

    def load_state_dict(self, state: Mapping[str, Mapping[str, int]]) -> None:
        """Counters from a checkpoint (missing ones start at zero)."""
        for name in self.COUNTERS:
            setattr(self, name, Counter(state.get(name, {})))

    def add(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        """Add counters shaped as ``state_dict``'s (what a lost attempt's finished work counted)."""
        for name in self.COUNTERS:
            getattr(self, name).update(counts.get(name, {}))

    def _log_failure(self, job: str, parsed: parsing.Parsed, raw: str, tokens: int) -> None:
        if self.failure_log is None:
            return
        line = {
            "job": job,
            "errors": parsed.errors,
            "repaired": parsed.repaired,
            "tokens": tokens,
            "answer": raw,
        }
        with self.failure_log.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line, ensure_ascii=False) + "\n")

    def as_metrics(self, prefix: str = "extractor/") -> dict[str, float]:
        out: dict[str, float] = {}
        for job in ("distil", "merge", "refine"):
            out[f"{prefix}{job}_calls"] = float(self.calls[job])
            out[f"{prefix}{job}_unparseable"] = float(self.unparseable[job])
            out[f"{prefix}{job}_tokens"] = float(self.tokens[job])
        for kind in ("add", "update", "return"):
            out[f"{prefix}ops_{kind}"] = float(self.ops[kind])
        out[f"{prefix}parse_failures"] = float(sum(self.unparseable.values()))
        return out


def job_counts(state: Mapping[str, Mapping[str, int]], job: str) -> dict[str, dict[str, int]]:
    """The part of ``ExtractorStats.state_dict()`` that ``job``'s calls count (operations come from
    distillation alone); the jobs' parts are disjoint."""
    return {
        name: dict(counts) if name == "ops" else {job: counts[job]}
        for name, counts in state.items()
        if (name == "ops" and job == "distil") or (name != "ops" and job in counts)
    }


class Extractor:
    """πϕ's three jobs over one inference engine (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        max_ops: int = 3,
        trajectory_chars: int = 2400,
        structured: bool | None = None,
        failure_log: Path | None = None,
        seed: int = 0,
    ) -> None:
        """``failure_log``: append every unparseable answer there (``ExtractorStats.failure_log``).
        ``seed``: the base of every answer's sampling seed (``sample_seed``)."""
        self.engine = engine
        self.seed = seed
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.repetition_penalty = repetition_penalty
        self.max_ops = max_ops
        self.trajectory_chars = trajectory_chars
        self.structured = engine.name == "vllm" if structured is None else structured
        self.expected_version = engine.weight_version
        """The version the trainer last synced; a generation stamped otherwise is stale."""
        self.stats = ExtractorStats(failure_log=failure_log)
        self._stats_lock = threading.Lock()
        self.serving = threading.RLock()
        """Held across a generation and its version check, and across a weight sync: a sync made on another
        thread (πϕ's sharded update, on the loop's thread) never lands in the middle of a generation."""

    # ---- engine calls ------------------------------------------------------------------------

    def prompt_text(self, messages: Sequence[Mapping[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)

    def prompt_ids(self, prompt: str) -> list[int]:
        """Token ids of a chat-formatted prompt: what the engine saw and what the update scores."""
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def sample_seed(self, key: str, prompt: str) -> int:
        """The sampling seed of one answer: a function of the run's seed, the caller's key (an episode's id
        for its distillation) and the prompt, not of what the engine sampled before. So an answer is the
        same whichever rank's engine gives it and in whatever order, and after a resume."""
        digest = hashlib.blake2b(f"{self.seed}\0{key}\0{prompt}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 1

    def generate(
        self,
        chats: Sequence[Sequence[Mapping[str, str]]],
        schemas: Sequence[Mapping[str, Any]],
        keys: Sequence[str],
    ) -> list[Generation]:
        """One batched call; each answer comes back as a ``Generation`` stamped with the weight version.
        ``keys``: one per chat, with its prompt they fix its sampling seed (``sample_seed``)."""
        texts = [self.prompt_text(m) for m in chats]
        requests = [
            GenerationRequest(
                prompt_ids=tuple(self.prompt_ids(t)),
                seed=self.sample_seed(key, t),
                max_new_tokens=self.max_new_tokens,
                temperature=self.temperature,
                top_p=self.top_p,
                repetition_penalty=self.repetition_penalty,
                json_schema=schema if self.structured else None,
            )
            for t, schema, key in zip(texts, schemas, keys, strict=True)
        ]
        with self.serving:
            outputs = self.engine.generate(requests)
            for out in outputs:
                if out.weight_version != self.expected_version:
                    raise StaleExtractorError(
                        f"the extractor engine answered with weight version {out.weight_version}, but the "
                        f"trainer last synced version {self.expected_version}: it serves stale weights"
                    )
            logprobs = [out.logprobs for out in outputs]
            if self.structured:
                logprobs = self._unconstrained_logprobs(requests, outputs)
        return [
            Generation(
                prompt=t,
                response=out.text,
                token_ids=tuple(out.token_ids),
                logprobs=tuple(lp),
                weight_version=out.weight_version,
            )
            for t, out, lp in zip(texts, outputs, logprobs, strict=True)
        ]

    def _unconstrained_logprobs(self, requests, outputs) -> list[list[float]]:
        """The sampled tokens' log-probs under the model itself, not under the JSON grammar.

        With structured outputs the engine reports log-probs renormalised over the tokens the grammar
        allowed (0.3-1 nat per token above the model's own on SmolLM2), while CISPO's ratio divides the
        trainer's unconstrained π_θ by them: the old log-probs must come from the same distribution.
        One prefill-only scoring call at the same weights gives them.
        """
        rows = [i for i, out in enumerate(outputs) if out.token_ids]
        if not rows:
            return [list(out.logprobs) for out in outputs]
        scored = self.engine.score(
            [list(requests[i].prompt_ids) for i in rows], [list(outputs[i].token_ids) for i in rows]
        )
        logprobs = [list(out.logprobs) for out in outputs]
        for i, lp in zip(rows, scored, strict=True):
            logprobs[i] = list(lp)
        return logprobs

    def _record(self, job: str, parsed: parsing.Parsed, g: Generation, ops: Sequence[Op] = ()) -> None:
        with self._stats_lock:
            self.stats.record(job, parsed, g.response, len(g.token_ids))
            for op in ops:
                self.stats.ops[op.kind] += 1

    def snapshot_stats(self) -> dict[str, float]:
        with self._stats_lock:
            return self.stats.as_metrics()

    def stats_state(self) -> dict[str, dict[str, int]]:
        with self._stats_lock:
            return self.stats.state_dict()

    def load_stats_state(self, state: Mapping[str, Mapping[str, int]]) -> None:
        with self._stats_lock:
            self.stats.load_state_dict(state)

    def add_stats(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        with self._stats_lock:
            self.stats.add(counts)

    # ---- the three jobs ----------------------------------------------------------------------

    def distil(self, requests: Sequence[DistilRequest]) -> list[DistilResult]:
        """Operations for each finished episode, in one engine call."""
        if not requests:
            return []
        chats = [
            xp.distil_messages(
                r.goal,
                r.steps,
                r.success,
                r.reward,
                r.retrieved,
                max_ops=self.max_ops,
                budget_chars=self.trajectory_chars,
            )
            for r in requests
        ]
        schemas = [xp.distil_schema(self.max_ops, r.retrieved is not None) for r in requests]
        generations = self.generate(chats, schemas, [r.episode_id for r in requests])
        results = []
        for r, g in zip(requests, generations, strict=True):
            parsed = parsing.parse_distil(
                g.response, max_ops=self.max_ops, can_update=r.retrieved is not None
            )
            ops = [self._op(r, p, g) for p in parsed.items]
            self._record("distil", parsed, g, ops)
            results.append(DistilResult(r, g, ops, parsed))
        return results

    @staticmethod
    def _op(r: DistilRequest, p: parsing.ParsedOp, g: Generation) -> Op:
        if p.kind == "return":
            return Return()
        if p.kind == "update" and r.retrieved is not None:
            return Update(r.retrieved.id, p.title, p.content, generation=g, source_episode=r.episode_id)
        return Add(r.scope, p.title, p.content, generation=g, source_episode=r.episode_id)

    def merge_fn(self, chunk: Sequence[Entry]) -> MergePlan:
        """The store's ``MergeFn``: a plan for one chunk; ``actions=None`` when unparseable. πϕ sees the
        entries numbered 1, 2, ... (``merge_messages``); the plan names them by their ids."""
        numbers = list(range(1, len(chunk) + 1))
        (g,) = self.generate([xp.merge_messages(chunk)], [xp.merge_schema(numbers)], ["merge"])
        parsed = parsing.parse_merge(g.response, numbers)
        self._record("merge", parsed, g)
        if not parsed.ok:
            return MergePlan(None, generation=g, raw=g.response)
        actions = tuple(replace(a, ids=tuple(chunk[n - 1].id for n in a.ids)) for a in parsed.items)
        return MergePlan(actions, generation=g, raw=g.response)

    def refine_fn(self, query: str, entry: Entry | None) -> Refinement:
        """Search-and-Ask's answer: the entry rewritten for the actor's question."""
        if entry is None:
            return Refinement("No stored experience matches this question yet.")
        (g,) = self.generate([xp.refine_messages(query, entry)], [xp.refine_schema()], ["refine"])
        parsed = parsing.parse_refine(g.response)
        self._record("refine", parsed, g)
        # the entry itself still helps when the answer is unusable
        text = parsed.items[0] if parsed.items else entry.text
        return Refinement(text, generation=g)
