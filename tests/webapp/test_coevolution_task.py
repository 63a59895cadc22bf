"""A complementary run end to end, trained as a worker's training process trains it (``train_claimed``: the
database reporter, the run monitor that relays a cancel, the experience store): real SmolLM2 actor and
extractor on two in-process vLLM engines, MiniHack-Room-5x5, the real experience bank (PostgreSQL +
pgvector through ExperienceManager), a tiny config (warm-up 1, merge every step, a buffer of 2) so that
every part of the dual loop happens within a few steps; then cancelled from the outside.

It trains in a thread of this process (a worker would start a child process for it, see
tests/webapp/test_training_task.py), so that the test can steer the actor. An
untrained 135M actor neither discovers the Search-and-Ask tool nor solves the room within a few steps, so
``Steered`` makes the first guided episode of each batch ask the bank and then walk to the stairs. Those
tokens are scored by the real engine (their log-probs are the model's own). Everything else (the runner
pausing the episode, retrieval, the extractor's refinement, credit, both updates, checkpoints, rows,
cancellation) is the code under test.
"""

from __future__ import annotations

import shutil
import threading
from datetime import timedelta

import pytest
import torch
from django.db import connection
from django.utils import timezone

from experience.models import Experience, Merge, SearchAsk
from tests.conftest import wait_for
from trainer import assemble
from trainer.checkpoint import TRACK_STATE_FILE as STATE_FILE
from trainer.checkpoint import read_checkpoint
from trainer.coevolution import JOURNAL_FILE, work_left
from trainer.config import get_preset
from trainer.extractor.track import TrackJournal, _Merge
from trainer.models import default_model_path, load_causal_lm, load_tokenizer, prepare_default_models
from trainer.rollout.base import Generation
from trainer.runfiles import read_lines
from webapp.models import EpisodeRecord, MetricRow, Run
from webapp.services import run_cancel
from webapp.training import run_dir, train_claimed

pytestmark = pytest.mark.django_db(transaction=True)

ASKED = "how do I reach the stairs?"
QUESTION = f"<search>{ASKED}</search>"
MOVE = " southeast"  # Room-5x5 has one layout: four moves southeast reach the stairs


class Steered:
    """The actor's engine, except that the first guided episode of each batch asks, then plays ``MOVE``."""

    def __init__(self, engine, tokenizer) -> None:
        self.inner, self.tokenizer = engine, tokenizer
        self.ask_ids = self._ids(" " + QUESTION)
        self.move_ids = self._ids(MOVE)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]

    def generate(self, requests):
        out = self.inner.generate(requests)
        asked = False
        for i, r in enumerate(requests):
            prompt = self.tokenizer.decode(r.prompt_ids)
            first_turn = prompt.count("<|im_start|>assistant") == 1
            if first_turn and "<search>" in prompt and not asked:  # the tool is offered: a guided episode
                asked, ids = True, self.ask_ids
            elif QUESTION in prompt:
                ids = self.move_ids
            else:
                continue
            (logprobs,) = self.inner.score([r.prompt_ids], [ids])
            text = self.tokenizer.decode(ids[:-1])
            out[i] = Generation(list(ids), logprobs, "stop", text, self.inner.weight_version)
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _config(path) -> dict:
    return (
        get_preset("cpu")
        .with_overrides(
            **{
                "method": "complementary",
                "steps": 30,  # cancelled long before
                "tasks_per_step": 1,
                "k_rollouts": 4,
                "eval_every": 0,
                "eval_episodes": 1,
                "checkpoint_every": 1,
                "actor.model_path": str(path),
                "actor.lr": 1e-4,
                "extractor.model_path": str(path),
                "extractor.buffer_size": 2,
                "extractor.max_new_tokens": 64,
                "experience.warmup_steps": 1,
                "experience.merge_every": 1,
                "rollout.max_new_tokens": 8,
                "rollout.turn_limit": 6,
                "rollout.context_tokens": 1024,
                "rollout.kv_cache_gib": 0.25,
            }
        )
        .to_dict()
    )


def _train_claimed(run_id: int) -> str:
    try:
        return train_claimed(Run.objects.get(pk=run_id))
    finally:
        connection.close()


def _latest(run: Run, key: str) -> float:
    row = MetricRow.objects.filter(run=run, kind="train").order_by("-step").first()
    return row.values.get(key, 0.0) if row else 0.0


def _changed(model: torch.nn.Module, reference: torch.nn.Module) -> bool:
    name = "model.layers.0.self_attn.q_proj.weight"
    return not torch.equal(dict(model.named_parameters())[name], dict(reference.named_parameters())[name])


@pytest.fixture
def steered_engine(monkeypatch):
    build = assemble.build_engine
    monkeypatch.setattr(
        assemble, "build_engine", lambda cfg: Steered(build(cfg), load_tokenizer(cfg.actor.model_path))
    )


@pytest.mark.timeout(1200)
def test_a_complementary_run_on_a_worker_distils_merges_asks_trains_both_models_and_cancels(
    user, steered_engine
):
    path = prepare_default_models(default_model_path())
    cfg = _config(path)
    run = Run.objects.create(name="coevolution", owner=user, method=cfg["method"], env=cfg["env"], config=cfg)
    assert run.claim("test")
    outcome: list[str] = []
    training = threading.Thread(target=lambda: outcome.append(_train_claimed(run.pk)), daemon=True)
    try:
        training.start()
        wait_for(lambda: _latest(run, "extractor/updates_with_signal") >= 1 or outcome, 1000, "a CISPO step")
        run_cancel(Run.objects.get(pk=run.pk))
        training.join(300)
        assert outcome == [Run.Status.CANCELLED], Run.objects.get(pk=run.pk).error
        run.refresh_from_db()
        rows = {r.step: r.values for r in MetricRow.objects.filter(run=run, kind="train")}
        print(
            {k: v for k, v in rows[max(rows)].items() if k.startswith(("extractor/", "experience/", "adv/"))}
        )

        # cancelled between steps, long before the end; one metrics row per finished step
        assert 2 <= run.step < 30 and sorted(rows) == list(range(1, run.step + 1)) and run.finished_at
        # the bank gained entries from distillation, and was merged every step after the first
        assert Experience.objects.filter(run=run).exists()
        assert rows[run.step]["extractor/distilled"] >= 4 and Merge.objects.filter(run=run).exists()
        # Search-and-Ask: recorded, answered by the extractor, credited by the episode's outcome
        exchanges = list(SearchAsk.objects.filter(run=run))
        # the steered questions; the actor may also ask on its own (in float32 it may copy the prompt's
        # "<search>your question</search>"), and those exchanges are recorded just the same
        steered = [e for e in exchanges if e.query == ASKED]
        assert steered and all(e.refined for e in steered)
        assert any(e.success is not None for e in exchanges)
        # retrieval starts after the warm-up
        assert rows[1]["experience/retrieval_active"] == 0.0 and rows[2]["experience/retrieval_active"] == 1.0
        # both models' parameters changed: the last checkpoint's actor and extractor against the start
        state = read_checkpoint(run_dir(run))
        reference = load_causal_lm(path)
        assert any(r["adv/abs_mean"] > 0 for r in rows.values())
        assert _changed(load_causal_lm(state.path / "actor"), reference)
        assert _changed(load_causal_lm(state.path / "extractor"), reference)
        # πϕ's optimiser and credit buffer are checkpointed beside its weights, for a resume
        saved = torch.load(state.path / "extractor" / STATE_FILE, weights_only=False)
        assert saved["optimizer"]["state"] and saved["buffer"]["steps_taken"] >= 1
        # ... and the cumulative counters, so that a resumed run's figures go on from there
        assert saved["counts"]["distilled"] >= 1 and saved["extractor_stats"]["calls"]["distil"] >= 1
        # ... and the track's work: credits settled, unfinished items kept, finished ones journaled
        assert saved["pending_credits"] == [] and isinstance(saved["unfinished"], list)
        journal = TrackJournal(run_dir(run) / JOURNAL_FILE).done
        assert len(journal) >= saved["counts"]["merges"] + 1  # every merge and at least one distil batch
    finally:
        shutil.rmtree(run_dir(run), ignore_errors=True)


@pytest.mark.timeout(1200)
def test_a_run_that_died_after_its_last_step_is_resumed_to_finish_the_extractors_queued_work(user):
    cfg = _config(prepare_default_models(default_model_path())) | {"steps": 1}
    run = Run.objects.create(name="last-step", owner=user, method=cfg["method"], env=cfg["env"], config=cfg)
    assert run.claim("test") and train_claimed(run) == Run.Status.SUCCEEDED, run.error
    try:
        # each evaluation's episodes, both columns (the eval instance without, then with experience), in the
        # database and in the run folder's log, beside step 1's training episodes
        both = [(0, False), (0, True), (1, False), (1, True)]
        evals = EpisodeRecord.objects.filter(run=run, kind="eval").order_by("step", "id")
        assert list(evals.values_list("step", "guided")) == both
        assert EpisodeRecord.objects.filter(run=run, kind="train").count() == 4
        logged = read_lines(run_dir(run) / "episodes.jsonl")
        assert [(e["step"], e["guided"]) for e in logged if e["eval"]] == both
        before = MetricRow.objects.get(run=run, kind="train", step=1).values
        # the worker dies after the last step's checkpoint, with a merge pass still queued on the track
        state = read_checkpoint(run_dir(run))
        saved_path = state.path / "extractor" / STATE_FILE
        saved = torch.load(saved_path, weights_only=False)
        saved["unfinished"].append(_Merge("lost-merge", 1))
        torch.save(saved, saved_path)
        assert work_left(run_dir(run), state.path)
        lost = timezone.now() - timedelta(hours=1)
        Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, heartbeat_at=lost)

        run.refresh_from_db()
        assert run.claim("test") and train_claimed(run) == Run.Status.SUCCEEDED, run.error
        # the resumed attempt trained no step, did the queued merge pass and journaled it ...
        assert "lost-merge" in TrackJournal(run_dir(run) / JOURNAL_FILE).done
        log = (run_dir(run) / "log.txt").read_text()
        assert "all 1 steps done; finishing the extractor's queued work" in log
        assert not work_left(run_dir(run), state.path)  # a third start would only mark it done
        # ... and wrote the last step's row again: the actor's figures as they were, the extractor's updated
        after = MetricRow.objects.get(run=run, kind="train", step=1).values
        assert after["extractor/merges"] == before["extractor/merges"] + 1
        actors = [k for k in before if not k.startswith(("extractor/", "bank/"))]
        assert "train/success" in actors and {k: after[k] for k in actors} == {k: before[k] for k in actors}
        on_file = [r for r in read_lines(run_dir(run) / "metrics.jsonl") if r["kind"] == "step"]
        assert {r["step"] for r in on_file} == {1}  # the last row of a step wins (the report reads it so)
        assert on_file[-1]["extractor/merges"] == after["extractor/merges"]
        # the evaluations came before the checkpoint the finishing pass resumed from: each is recorded once
        assert list(evals.values_list("step", "guided")) == both
        assert [
            (e["step"], e["guided"]) for e in read_lines(run_dir(run) / "episodes.jsonl") if e["eval"]
        ] == both
    finally:
        shutil.rmtree(run_dir(run), ignore_errors=True)
