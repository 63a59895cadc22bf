from __future__ import annotations

import os
import socket
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from trainer.config import ConfigError
from trainer.report import ConsoleReporter
from trainer.train import add_arguments, config_from_args, run_from_args
from webapp.management.database import DatabaseCommand
from webapp.models import Run
from webapp.supervisor import claim_and_train
from webapp.tasks import failure_message
from webapp.training import run_training
from webapp.workers import check, stand_in


class Command(DatabaseCommand):
    help = (
        "Train headless: manage.py train --config cpu --env MiniHack-Room-5x5 --method complementary "
        "--steps 20 [--set actor.lr=2e-5 ...] [--resume RUN_OR_CHECKPOINT] [--out DIR]. Prints a progress "
        "line per step. The run is recorded in the database (it shows on the dashboard, with its "
        "experience bank) unless --no-record."
    )

    def add_arguments(self, parser) -> None:
        add_arguments(parser)
        parser.add_argument("--name", default="", help="the run's name on the dashboard")
        parser.add_argument(
            "--owner",
            default=os.environ.get("STUDIO_ADMIN_USER", "admin"),
            help="username that owns the recorded run [admin]",
        )
        parser.add_argument("--no-record", action="store_true", help="do not record the run (grpo only)")

    def handle(self, *args, **options) -> None:
        self.stdout.ending = ""
        namespace = _Namespace(options)
        try:
            _refuse_what_does_not_fit(config_from_args(namespace))
            if options["no_record"] and config_from_args(namespace).nproc > 1:
                raise CommandError(
                    "--no-record trains in this process: for several processes use python -m trainer.train "
                    "--nproc N, or record the run (drop --no-record)"
                )
            if options["no_record"]:
                run_from_args(namespace, stdout=self.stdout)
            else:
                self._recorded(namespace)
        except ConfigError as err:
            raise CommandError(str(err)) from err

    def _recorded(self, args: _Namespace) -> None:
        cfg = config_from_args(args)
        owner = get_user_model().objects.filter(username=args.owner).first()
        if owner is None:
            raise CommandError(f"no user {args.owner!r} to own the run: pass --owner, or run ensure_admin")
        run = Run.objects.create(
            name=args.name or f"{cfg.method} on {cfg.env} (cli)",
            owner=owner,
            method=cfg.method,
            env=cfg.env,
            seed=cfg.seed,
            config=cfg.to_dict(),
            resume_from=str(args.resume or ""),
        )
        self.stdout.write(f"run {run.pk} recorded; folder: {args.out or 'var/runs/' + str(run.uid)}\n")
        if cfg.nproc > 1:  # a torchrun group of train_claimed ranks, supervised as a worker does
            if args.out:
                Run.objects.filter(pk=run.pk).update(checkpoint_dir=str(Path(args.out).resolve()))
            status = claim_and_train(run, worker=f"cli@{socket.gethostname()}")
            self.stdout.write(f"run {run.pk} {status}\n")
            return
        run.claim(worker=f"cli@{socket.gethostname()}")
        try:
            status = run_training(
                run, out_dir=args.out and Path(args.out), extra_reporters=[ConsoleReporter(self.stdout)]
            )
        except KeyboardInterrupt:
            run.finish(Run.Status.CANCELLED, "interrupted from the command line")
            raise CommandError(
                f"run {run.pk} interrupted; resume with --resume {run.checkpoint_dir}"
            ) from None
        except Exception as exc:
            run.mark_failed(failure_message(exc))
            raise
        self.stdout.write(f"run {run.pk} {status}\n")


def _refuse_what_does_not_fit(cfg) -> None:
    """The launch form's rule, on this machine (``STUDIO_WORKER_DEVICES`` where set): a config whose plan does
    not fit its devices is refused with the plan's numbers and a fix, before anything loads."""
    here = stand_in()
    why = check(cfg, here).why_not
    if why is not None:
        raise CommandError(
            f"refused: this machine ({here.devices.describe()}) cannot run it: {why}. "
            "manage.py plan with the same flags prints the whole plan."
        )


class _Namespace:
    def __init__(self, options: dict) -> None:
        self.__dict__.update(options)
