from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from django.core.management.base import CommandError

from trainer.checkpoint import read_checkpoint
from trainer.coevolution import BankRetriever
from trainer.envs import make_mixture
from trainer.evaluate import evaluate_checkpoint, summary_table
from webapp.management.database import DatabaseCommand
from webapp.models import Run
from webapp.training import experience_store


class Command(DatabaseCommand):
    help = (
        "Evaluate a checkpoint on its env's frozen eval split: success rate and mean actions without "
        "experience, and with experience from a run's bank (--bank RUN_ID, default: the run that wrote the "
        "checkpoint, when it has one)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("checkpoint", help="a checkpoint folder, or a run folder (its latest checkpoint)")
        parser.add_argument("--env", help="env or mixture (default: the run's)")
        parser.add_argument("--episodes", type=int, help="eval episodes per env (default: the run's)")
        parser.add_argument("--engine", choices=["vllm", "hf"], help="rollout engine (default: the run's)")
        parser.add_argument("--bank", type=int, help="id of the run whose experience bank to use")
        parser.add_argument("--no-experience", action="store_true", help="only the without-experience column")

    def handle(self, *args, checkpoint: str, **opts) -> None:
        path = Path(checkpoint)
        try:
            state = read_checkpoint(path)
        except (FileNotFoundError, ValueError) as err:
            raise CommandError(f"no checkpoint at {path}: {err}") from err
        bank = None if opts["no_experience"] else self._bank_run(path, opts["bank"])
        with ExitStack() as stack:
            retrieve = None
            if bank is not None:
                store = stack.enter_context(experience_store(bank, state.config))
                retrieve = BankRetriever(store, state.config, count=False)
                self.stdout.write(f"with experience from the bank of run {bank.pk} ({bank.name})")
            options = {"env": opts["env"], "episodes": opts["episodes"], "engine_name": opts["engine"]}
            metrics = evaluate_checkpoint(path, retrieve=retrieve, **options)
        env = opts["env"] or state.config.env
        names = make_mixture(env).names
        table = summary_table(metrics, names) if len(names) > 1 else summary_table(metrics, mean_label=env)
        self.stdout.write(table)

    def _bank_run(self, path: Path, run_id: int | None) -> Run | None:
        if run_id is not None:
            run = Run.objects.filter(pk=run_id).first()
            if run is None:
                raise CommandError(f"no run {run_id}: --bank takes the id of a run with an experience bank")
            return run
        resolved = str(path.resolve())
        runs = Run.objects.exclude(checkpoint_dir="")
        return next((r for r in runs if resolved.startswith(r.checkpoint_dir)), None)
