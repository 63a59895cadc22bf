from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from trainer.config import ConfigError
from trainer.experiments.spec import ExperimentSpec
from trainer.experiments.summary import SUMMARY_FILE, include_summary, verify, write_report
from webapp.experiments import config_drift, experiment_cells, experiment_run, results_dir
from webapp.management.database import require_database
from webapp.models import Experiment

RESULTS_PAGE = Path("docs") / "results.md"
"""The documentation page that includes each experiment's generated summary (the README links to it)."""


class Command(BaseCommand):
    help = (
        "Experiments (configs/experiments/*.toml): 'run FILE' queues every unfinished cell of the grid on "
        "the training queue (--here: trains them one after another in this process); running it again skips "
        "finished cells and resumes unfinished ones (--restart CELL starts one again from scratch). 'status "
        "FILE' shows the grid. 'report NAME' writes report.md, plots, summary.csv and summary.md (the "
        "generated block in docs/results.md) from the committed result files (docs/experiments/NAME/). "
        "'verify NAME' rebuilds the report into a temporary folder and fails, listing the differences, if"
        " the committed report or the results page's copy of its summary differs from it."
    )

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        run = sub.add_parser("run", help="queue (or --here: train) every unfinished cell")
        run.add_argument("file", type=Path)
        run.add_argument("--here", action="store_true", help="train in this process, one cell after another")
        run.add_argument("--only", action="append", default=[], help="a cell (grpo/s0) or an arm; repeatable")
        run.add_argument(
            "--restart",
            action="append",
            default=[],
            help="a cell (grpo/s0) or an arm to start again from scratch (the old run is kept); repeatable",
        )
        run.add_argument("--owner", default=os.environ.get("STUDIO_ADMIN_USER", "admin"))
        status = sub.add_parser("status", help="each cell's run and state")
        status.add_argument("file", type=Path)
        report = sub.add_parser("report", help="build the report from the result files")
        report.add_argument("name", help="the experiment's name (its folder under docs/experiments/)")
        report.add_argument("--out", type=Path, help="report folder [docs/experiments/NAME/report]")
        verify = sub.add_parser(
            "verify", help="rebuild the report and fail on any difference from the committed"
        )
        verify.add_argument("name", help="the experiment's name (its folder under docs/experiments/)")
        verify.add_argument(
            "--page",
            "--readme",
            dest="readme",
            type=Path,
            help=f"the page whose generated block must equal the summary [{RESULTS_PAGE}]",
        )

    def handle(self, *args, **options) -> None:
        self.stdout.ending = "\n"
        try:
            getattr(self, f"_{options['action'].replace('-', '_')}")(options)
        except ConfigError as err:
            raise CommandError(str(err)) from err

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    def _run(self, options) -> None:
        spec = ExperimentSpec.from_file(options["file"])
        require_database()
        owner = get_user_model().objects.filter(username=options["owner"]).first()
        if owner is None:
            raise CommandError(
                f"no user {options['owner']!r} to own the runs: pass --owner, or run ensure_admin"
            )
        try:
            experiment_run(
                spec,
                owner,
                here=options["here"],
                only=options["only"],
                restart=options["restart"],
                say=self._say,
            )
        except ValueError as err:
            raise CommandError(str(err)) from err

    def _status(self, options) -> None:
        spec = ExperimentSpec.from_file(options["file"])
        require_database()
        experiment = Experiment.objects.filter(name=spec.name).first()
        if experiment is None:
            self._say(
                f"experiment {spec.name!r} has not been run yet in this database: "
                f"experiment run {options['file']}"
            )
        for state in experiment_cells(experiment, spec):
            run = state.run
            where = f"run {run.pk}, step {run.step}/{state.cell.config.steps}" if run else ""
            if run and (drift := config_drift(run, state.cell)):
                where += f"  (started under another config: {drift})"
            self._say(f"{state.cell.key:32} {state.status:12} {where}")

    def _report(self, options) -> None:
        folder = results_dir(options["name"])
        if not (folder / "runs").is_dir():
            raise CommandError(f"no result files in {folder / 'runs'}: run the experiment first")
        out = write_report(folder, out_dir=options["out"])
        self._say(f"report: {out / 'report.md'}")
        if options["out"] is None:
            self._include_summary(options["name"], out)

    def _include_summary(self, name: str, report: Path) -> None:
        """Refresh the results page's generated block of this experiment's summary, where it has one."""
        readme = Path(settings.BASE_DIR) / RESULTS_PAGE
        block = f"docs/experiments/{name}/report/{SUMMARY_FILE}"
        if readme.exists() and include_summary(
            readme, block, (report / SUMMARY_FILE).read_text(encoding="utf-8")
        ):
            self._say(f"{RESULTS_PAGE}: its block of {block} now holds the summary")

    def _verify(self, options) -> None:
        folder = results_dir(options["name"])
        if not (folder / "runs").is_dir():
            raise CommandError(f"no result files in {folder / 'runs'}: run the experiment first")
        readme = options["readme"] or Path(settings.BASE_DIR) / RESULTS_PAGE
        block = f"docs/experiments/{options['name']}/report/{SUMMARY_FILE}"
        try:
            differences = verify(folder, readme=readme, summary_path=block)
        except ValueError as err:
            raise CommandError(str(err)) from err
        if differences:
            raise CommandError(
                f"{options['name']}: the committed report or {readme} differs from the report rebuilt from "
                f"{folder / 'runs'} ({len(differences)} lines below); rebuild it with 'experiment report "
                f"{options['name']}' (it also refreshes the block of {block} in {RESULTS_PAGE}):\n"
                + "\n".join(differences)
            )
        self._say(f"{options['name']}: the committed report and the summary in {readme} match the run files")
