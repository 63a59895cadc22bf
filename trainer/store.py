"""The experience store as the trainer sees it: a protocol and the plain dataclasses it passes.

``trainer/`` never imports Django. The webapp's ``experience.manager.ExperienceManager`` implements
``ExperienceStore`` over PostgreSQL + pgvector; anything else with the same methods (an in-memory
store in a script) works too. Operations mirror the extractor's vocabulary (docs/design.md §3.2–3.3):
Add a new entry, Update a retrieved one, Return (nothing worth keeping), Delete.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

SHARED_SCOPE = "shared"


@dataclass(frozen=True)
class Generation:
    """The extractor sample that produced a text: the CISPO training sample credited by its outcomes."""

    prompt: str = ""
    """The extractor's prompt (chat-formatted text)."""
    response: str = ""
    """The extractor's raw response."""
    token_ids: tuple[int, ...] = ()
    """Response token ids as sampled."""
    logprobs: tuple[float, ...] = ()
    """Generation-time (old) log-probabilities of ``token_ids``, one per token."""
    weight_version: int | None = None
    """Version of the extractor weights that sampled it; stale weights must be detectable."""


@dataclass(frozen=True)
class Entry:
    """One experience as read from the bank (no embedding, no generation: they stay in storage)."""

    id: int
    scope: str
    title: str
    content: str
    version: int = 1
    """Incremented on every change of text, scope, pin or deletion state."""
    pinned: bool = False
    retrieval_count: int = 0
    training_count: int = 0
    last_trained_step: int | None = None
    guided_successes: int = 0
    guided_failures: int = 0
    created_step: int = 0
    updated_step: int = 0
    similarity: float | None = None
    """Cosine similarity to the query that found it (retrieval only)."""
    score: float | None = None
    """Diversified ranking score s (retrieval only); equals ``similarity`` without diversification."""

    @property
    def text(self) -> str:
        """What the actor sees in its prompt."""
        return f"{self.title}\n{self.content}"


@dataclass(frozen=True)
class Add:
    scope: str
    title: str
    content: str
    generation: Generation | None = None
    source_episode: str = ""
    """Id of the trajectory/episode the entry was distilled from."""
    kind: Literal["add"] = "add"


@dataclass(frozen=True)
class Update:
    entry_id: int
    title: str
    content: str
    generation: Generation | None = None
    source_episode: str = ""
    kind: Literal["update"] = "update"


@dataclass(frozen=True)
class Return:
    """The extractor found nothing worth keeping; recorded nowhere, changes nothing."""

    kind: Literal["return"] = "return"


@dataclass(frozen=True)
class Delete:
    entry_id: int
    kind: Literal["delete"] = "delete"


Op = Add | Update | Return | Delete


@dataclass(frozen=True)
class OpResult:
    """What one operation did: the entry it created or changed (None for Return), or why it was refused."""

    op: Op
    entry_id: int | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class MergeAction:
    """One decision of the merge function about entries of its chunk (ids are ``Entry.id`` values).

    keep: leave ``ids`` as they are (entries a plan does not mention are kept too);
    discard: remove ``ids``; rewrite: replace the text of the single entry in ``ids``;
    merge: replace all of ``ids`` by one new entry with ``title``/``content``.
    Pinned entries are never changed or removed by a merge, whatever the plan says.
    """

    kind: Literal["keep", "discard", "rewrite", "merge"]
    ids: tuple[int, ...]
    title: str = ""
    content: str = ""


@dataclass(frozen=True)
class MergePlan:
    """The merge function's parsed answer for one chunk; ``actions=None`` means it was unparseable."""

    actions: tuple[MergeAction, ...] | None
    generation: Generation | None = None
    raw: str = ""


MergeFn = Callable[[Sequence[Entry]], MergePlan]
"""Given a chunk of entries (carried ones first), say what to keep, discard, rewrite or merge."""


@dataclass(frozen=True)
class Refinement:
    text: str
    generation: Generation | None = None


@dataclass(frozen=True)
class GuidedOutcome:
    """The outcome of one episode guided by ``entry_id`` (and of its Search-and-Ask exchanges)."""

    episode_id: str
    success: bool
    entry_id: int | None = None


@dataclass
class MergeReport:
    scope: str
    chunks: int = 0
    merge_ids: list[int] = field(default_factory=list)
    """One record per chunk; ``manager.undo_merge(id)`` reverts it."""
    removed: int = 0
    created: int = 0
    rewritten: int = 0
    unparseable: int = 0
    stale: int = 0
    """Chunks skipped because an entry changed while the merge function was thinking."""


@runtime_checkable
class ExperienceStore(Protocol):
    """What the trainer needs from an experience bank. One store per run, shared by all workers."""

    def retrieve(
        self, queries: Sequence[str], scope: str, k: int = 1, *, count: bool = True
    ) -> list[list[Entry]]:
        """Top-``k`` entries of ``scope`` for each query (diversified), best first; counts the retrievals
        unless ``count`` is False (evaluation reads the bank without changing what training retrieves)."""
        ...

    def apply(self, ops: Sequence[Op], *, step: int, key: str = "") -> list[OpResult]:
        """Apply extractor operations, each atomically and recorded in the bank's history. With ``key``
        the batch applies at most once per run: a key applied before applies nothing and returns the
        outcomes it had (the track's batch keys, so that a resumed run redoing a batch the lost process
        had committed but not journaled adds no entry twice)."""
        ...

    def record_ask(
        self,
        query: str,
        scope: str,
        entry: Entry | None,
        refinement: Refinement,
        *,
        episode_id: str = "",
        step: int = 0,
    ) -> int:
        """Record a Search-and-Ask exchange (the actor's question, the entry ``retrieve`` found for it and
        πϕ's refinement of it) and return its id; its outcome comes later (``record_outcomes``)."""
        ...

    def merge(self, scope: str, merge_fn: MergeFn, *, step: int) -> MergeReport:
        """Walk the scope's bank in chunks through ``merge_fn``, carrying merged output forward."""
        ...

    def record_outcomes(self, outcomes: Sequence[GuidedOutcome]) -> None:
        """Credit guided successes/failures to entries and to the episodes' Search-and-Ask exchanges."""
        ...

    def record_training(self, entry_ids: Sequence[int], *, step: int) -> None:
        """Count one extractor training use of each entry's generation at ``step``."""
        ...

    def generations(
        self, entry_ids: Sequence[int], versions: Mapping[int, int] | None = None
    ) -> dict[int, Generation]:
        """The generation that produced each entry (for the extractor's training buffer): of the version
        in ``versions`` where given (the text an actor saw, though the entry may have changed since),
        else of the current version. Entries or versions that cannot be found are left out."""
        ...

    def size(self, scope: str | None = None) -> int:
        """Live entries in the bank, or in one scope."""
        ...

    def close_thread(self) -> None:
        """Release what the calling thread holds (its database connection); threads call it as they end."""
        ...
