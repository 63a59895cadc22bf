"""A checkpoint loads into any number of processes (issue 47): one written by 2 processes (DCP folders)
resumes on 1, one written by 1 process (plain files) resumes on 2, each with the weights, the AdamW states,
the RNG and the extractor track's state that were saved, and goes on as the run that never stopped
(``reshard_worker.py``: the run's ``Checkpointer``, a tiny random Llama as the actor and as πϕ)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import check_resumable
from trainer.config import ConfigError, get_preset

WORKER = Path(__file__).with_name("reshard_worker.py")
REPO = Path(__file__).resolve().parents[2]
ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _run(nproc: int, *args: str | Path) -> None:
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    done = subprocess.run(
        [*launcher, str(WORKER), *map(str, args)], env=ENV, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


@pytest.fixture(scope="module", params=[(2, 1), (1, 2)], ids=["2-to-1", "1-to-2"])
def resharded(request, tmp_path_factory) -> tuple[dict, dict, Path]:
    saved_on, resumed_on = request.param
    saved_dir, resumed_dir = tmp_path_factory.mktemp("saved"), tmp_path_factory.mktemp("resumed")
    _run(saved_on, "save", saved_dir)
    checkpoint = saved_dir / "checkpoints" / "step-000001"
    _run(resumed_on, "resume", resumed_dir, checkpoint)
    load = lambda folder, mode, n: torch.load(folder / f"{mode}-{n}.pt", weights_only=False)  # noqa: E731
    return load(saved_dir, "save", saved_on), load(resumed_dir, "resume", resumed_on), checkpoint


def _max_abs(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@pytest.mark.parametrize("part", ["actor", "extractor"])
def test_a_checkpoint_resumed_on_another_process_count_holds_its_weights_and_adamw_state(resharded, part):
    saved, resumed, checkpoint = resharded
    assert _max_abs(resumed[f"{part}_weights"], saved[f"{part}_weights"]) == 0.0
    before, after = saved[f"{part}_optimizer"], resumed[f"{part}_optimizer"]
    assert before.keys() == after.keys() and len(before) == len(saved[f"{part}_weights"])
    for name, state in before.items():
        assert float(after[name]["step"]) == float(state["step"]) == 2.0
        for moment in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(after[name][moment], state[moment]), (name, moment)
    assert max(float(s["exp_avg_sq"].abs().max()) for s in before.values()) > 0.0  # a state that trained


def test_a_checkpoint_resumed_on_another_process_count_goes_on_as_the_run_that_never_stopped(resharded):
    saved, resumed, checkpoint = resharded
    assert torch.equal(resumed["rand"], saved["rand"])  # rank 0's RNG states came back
    assert resumed["track"] == {"credits": [1, 2, 3], "distilled": 7}
    for part in ("actor", "extractor"):  # the parity tolerance of test_parallel.py across process counts
        assert _max_abs(resumed[f"{part}_weights_2"], saved[f"{part}_weights_2"]) < 1e-6
        assert _max_abs(saved[f"{part}_weights_2"], saved[f"{part}_weights"]) > 0.0  # the step moved them


def test_each_format_is_the_one_its_process_count_writes(resharded):
    saved, resumed, checkpoint = resharded
    sharded = (checkpoint / "dcp" / ".metadata").exists()
    assert sharded == (checkpoint / "extractor" / "dcp" / ".metadata").exists()
    assert sharded != (checkpoint / "optimizer.pt").exists()
    assert (checkpoint / "actor" / "model.safetensors").exists()
    assert (checkpoint / "extractor" / "model.safetensors").exists()


def test_the_process_count_and_device_may_change_on_resume_but_not_what_the_run_computes():
    saved = get_preset("cpu").with_overrides(nproc=2)
    check_resumable(saved, saved.with_overrides(nproc=1, device="cpu", steps=400))
    check_resumable(saved, saved.with_overrides(**{"actor.gradient_checkpointing": False}))
    for key, value in (("seed", 7), ("actor.lr", 3e-5), ("actor.micro_batch_size", 2), ("k_rollouts", 4)):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            check_resumable(saved, saved.with_overrides(nproc=1, **{key: value}))
