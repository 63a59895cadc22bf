"""Evaluation with and without experience (docs/design.md §3.5: the paper's two columns).

Greedy episodes on the first ``episodes`` instances of each environment's frozen eval split, played twice:
without experience (``eval/...``) and with the top-1 retrieved entry injected into the system prompt
(``eval/with_exp/...``). Reported per environment for mixtures and averaged over environments (each env
weighs the same, whatever its number of eval instances): success rate, mean action count, mean reward. The
envs of a mixture play each column in one batch. Every method evaluates here (``TrainingLoop.evaluate`` too).

``evaluate_checkpoint(path)`` evaluates a saved actor; ``manage.py evaluate <checkpoint>`` wraps it.
Search-and-Ask is not used in evaluation: the "with experience" column measures retrieval alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from trainer.envs.base import make_env, make_mixture
from trainer.metrics import Metrics
from trainer.rollout.runner import Episode, EpisodeRunner, EpisodeSpec, Retriever

EVAL_TEMPERATURE = 0.0
WITH_EXP = "with_exp/"


def eval_specs(env_name: str, episodes: int, *, guided: bool) -> list[EpisodeSpec]:
    """The first ``episodes`` instances of the env's eval split (all of them when the split is smaller)."""
    size = make_env(env_name, split="eval").num_instances()
    n = min(episodes, size) if size else episodes
    return [EpisodeSpec(env_name, seed, group=seed, guided=guided) for seed in range(n)]


def column_metrics(per_env: dict[str, list[Episode]], prefix: str) -> Metrics:
    """Success, actions and reward per env (mixtures only) and averaged over envs, under ``prefix``."""
    metrics: Metrics = {}
    rows = {}
    for name, episodes in per_env.items():
        n = max(len(episodes), 1)
        rows[name] = {
            "success": sum(e.success for e in episodes) / n,
            "actions": sum(e.num_actions for e in episodes) / n,
            "reward": sum(e.reward for e in episodes) / n,
            "episodes": float(len(episodes)),
        }
        if len(per_env) > 1:
            metrics |= {f"{prefix}{name}/{k}": v for k, v in rows[name].items()}
    for key in ("success", "actions", "reward"):
        metrics[f"{prefix}{key}"] = sum(r[key] for r in rows.values()) / max(len(rows), 1)
    metrics[f"{prefix}episodes"] = sum(r["episodes"] for r in rows.values())
    return metrics


def evaluate(
    runner: EpisodeRunner,
    env: str,
    episodes: int,
    *,
    retrieve: Retriever | None = None,
    progress: Callable[..., None] | None = None,
    on_episodes: Callable[[list[Episode]], None] | None = None,
) -> Metrics:
    """Both columns for ``env`` (a name or a mixture): without experience, and with it when ``retrieve`` is
    given. ``runner`` should be an eval-split runner (``EpisodeRunner(..., split="eval")``). ``progress``
    gets (episodes finished, episodes in both columns) as they finish; ``on_episodes`` gets the played
    episodes once both columns are done, column by column (the with-experience column's are ``guided``)."""
    t0 = time.perf_counter()
    names = make_mixture(env).names
    columns: list[tuple[str, bool]] = [("eval/", False)]
    if retrieve is not None:
        columns.append(("eval/" + WITH_EXP, True))
    metrics: Metrics = {}
    all_played: list[Episode] = []
    for column, (prefix, guided) in enumerate(columns):
        # a mixture's envs play in one batch: one engine call per turn for all of them, not one per env
        specs = {name: eval_specs(name, episodes, guided=guided) for name in names}
        played, _ = runner.run(
            [s for env_specs in specs.values() for s in env_specs],
            retrieve=retrieve if guided else None,
            temperature=EVAL_TEMPERATURE,
            progress=_across_columns(progress, column, len(columns)),
        )
        all_played += played
        per_env: dict[str, list[Episode]] = {}
        for name, env_specs in specs.items():
            per_env[name], played = played[: len(env_specs)], played[len(env_specs) :]
        metrics |= column_metrics(per_env, prefix)
    if on_episodes is not None:
        on_episodes(all_played)
    if retrieve is not None:
        metrics["eval/exp_gain"] = metrics["eval/" + WITH_EXP + "success"] - metrics["eval/success"]
    metrics["eval/time_s"] = time.perf_counter() - t0
    return metrics


def _across_columns(progress, column: int, columns: int) -> Callable[..., None] | None:
    """A runner's (done, total, turn, turns) of one column as (done, total) over every column (each the same
    size), with the column's turn."""
    if progress is None:
        return None
    return lambda done, total, *turn: progress(column * total + done, columns * total, *turn)


def eval_runner(engine, actor_dir: Path | str, rollout, placement: str = "system") -> EpisodeRunner:
    """An eval-split runner for the actor in ``actor_dir`` served by ``engine``, under a ``RolloutConfig``
    (``placement``: where a guided episode's experience goes, ``experience.placement``)."""
    from trainer.models import load_tokenizer

    return EpisodeRunner(
        engine,
        load_tokenizer(actor_dir),
        split="eval",
        max_new_tokens=rollout.max_new_tokens,
        turn_limit=rollout.turn_limit,
        context_tokens=rollout.context_tokens,
        experience_placement=placement,
    )


def evaluate_checkpoint(
    path: Path | str,
    *,
    env: str | None = None,
    episodes: int | None = None,
    retrieve: Retriever | None = None,
    engine_name: str | None = None,
) -> Metrics:
    """Evaluate the actor saved in checkpoint ``path`` (a checkpoint folder or a run folder: its latest).

    ``env`` and ``episodes`` default to the run's config; ``retrieve`` (e.g. ``BankRetriever`` over the
    run's ``ExperienceManager``) adds the with-experience column. Builds and closes its own engine.
    """
    from trainer.checkpoint import read_checkpoint
    from trainer.rollout.base import engine_from_config

    state = read_checkpoint(Path(path))
    cfg = state.config
    actor_dir = state.path / "actor"
    r = cfg.rollout
    engine = engine_from_config(actor_dir, r, seed=cfg.seed, name=engine_name or "", device=cfg.device)
    runner = eval_runner(engine, actor_dir, r, cfg.experience.placement)
    try:
        metrics = evaluate(runner, env or cfg.env, episodes or cfg.eval_episodes, retrieve=retrieve)
    finally:
        runner.close()
        engine.close()
    metrics["eval/checkpoint_step"] = float(state.step)
    return metrics


def summary_table(metrics: Metrics, names: Sequence[str] = (), mean_label: str = "mean") -> str:
    """The two columns as a small text table (success rate and mean actions, with / without experience):
    a row per env in ``names``, then the mean row (labelled ``mean_label``: the env's name for one env)."""
    lines = [f"{'env':<28} {'success w/o':>11} {'success w/':>10} {'actions w/o':>11} {'actions w/':>10}"]
    for name in [*names, ""]:
        key = f"{name}/" if name else ""

        def get(col: str, k: str, key: str = key) -> str:
            v = metrics.get(f"eval/{col}{key}{k}")
            return f"{v:.3f}" if v is not None else "-"

        label = name or mean_label
        lines.append(
            f"{label:<28} {get('', 'success'):>11} {get(WITH_EXP, 'success'):>10} "
            f"{get('', 'actions'):>11} {get(WITH_EXP, 'actions'):>10}"
        )
    return "\n".join(lines)
