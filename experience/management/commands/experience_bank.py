"""Curate a run's experience bank from the command line: stats, export, import, prune, undo.

manage.py experience_bank stats RUN
manage.py experience_bank export RUN [--scope S] [-o bank.jsonl]
manage.py experience_bank import RUN bank.jsonl
manage.py experience_bank prune RUN [--never-retrieved] [--success-below 0.3 --min-guided 4]
                                    [--older-than-step 100] [--scope S] [--any] [--dry-run]
manage.py experience_bank undo CHANGE_ID | --merge MERGE_ID | --prune RUN:PRUNE_ID
"""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count, Q, Sum

from experience import services
from experience.bank import BankError
from experience.models import Experience, ExperienceChange, Merge
from experience.selectors import PruneRule, experience_prune_preview
from webapp.models import Run


class Command(BaseCommand):
    help = (
        "Curate a run's experience bank: stats, export/import JSONL, prune by rule, undo a change or merge."
    )

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        stats = sub.add_parser("stats")
        stats.add_argument("run", type=int)
        export = sub.add_parser("export")
        export.add_argument("run", type=int)
        export.add_argument("--scope")
        export.add_argument("-o", "--output", help="File to write (default: standard output).")
        imp = sub.add_parser("import")
        imp.add_argument("run", type=int)
        imp.add_argument("path")
        prune = sub.add_parser("prune")
        prune.add_argument("run", type=int)
        prune.add_argument("--never-retrieved", action="store_true")
        prune.add_argument("--success-below", type=float)
        prune.add_argument("--min-guided", type=int, default=1)
        prune.add_argument("--older-than-step", type=int)
        prune.add_argument("--scope")
        prune.add_argument("--dry-run", action="store_true", help="List what would go, delete nothing.")
        prune.add_argument(
            "--any", dest="any_rule", action="store_true",
            help="Delete entries matching ANY criterion (default: ALL of them).",
        )  # fmt: skip
        undo = sub.add_parser("undo")
        undo.add_argument("change", type=int, nargs="?")
        undo.add_argument("--merge", type=int)
        undo.add_argument("--prune", help="RUN:PRUNE_ID, as printed by prune: bring back all it deleted")

    def handle(self, *args, action: str, **opts) -> None:
        try:
            getattr(self, f"_{action}")(**opts)
        except (BankError, ValueError) as exc:
            raise CommandError(str(exc)) from exc

    def _run(self, run_id: int) -> Run:
        try:
            return Run.objects.get(pk=run_id)
        except Run.DoesNotExist:
            raise CommandError(f"there is no run {run_id}") from None

    def _stats(self, run: int, **_) -> None:
        run = self._run(run)
        rows = (
            Experience.objects.in_bank(run.pk)
            .values("scope")
            .annotate(n=Count("id"), pinned=Count("id", filter=Q(pinned=True)), uses=Sum("retrieval_count"))
            .order_by("scope")
        )
        for row in rows:
            self.stdout.write(
                f"{row['scope']:<30} {row['n']:>7} entries {row['pinned']:>5} pinned "
                f"{row['uses'] or 0:>9} retrievals"
            )
        self.stdout.write(f"merges recorded: {Merge.objects.filter(run=run).count()}")

    def _export(self, run: int, scope: str | None, output: str | None, **_) -> None:
        run = self._run(run)
        if output:
            with open(output, "w", encoding="utf-8") as out:
                n = services.experience_export(run, out, scope=scope)
            self.stderr.write(f"exported {n} entries to {output}")
        else:
            services.experience_export(run, sys.stdout, scope=scope)

    def _import(self, run: int, path: str, **_) -> None:
        run = self._run(run)
        with open(path, encoding="utf-8") as lines:
            n = services.experience_import(run, lines)
        self.stdout.write(f"imported {n} entries into run {run.pk}")

    def _prune(
        self,
        run: int,
        scope,
        never_retrieved,
        success_below,
        min_guided,
        older_than_step,
        dry_run,
        any_rule,
        **_,
    ):
        run = self._run(run)
        rule = PruneRule(
            never_retrieved=never_retrieved, success_rate_below=success_below, min_guided=min_guided,
            older_than_step=older_than_step, scope=scope, combine="any" if any_rule else "all",
        )  # fmt: skip
        doomed = list(experience_prune_preview(run, rule))
        for e in doomed:
            self.stdout.write(f"#{e.pk:<8} [{e.scope}] {e.title}")
        if dry_run:
            self.stdout.write(f"would delete {len(doomed)} entries")
            return
        n, batch = services.experience_prune(run, [e.pk for e in doomed])
        self.stdout.write(
            f"deleted {n} entries (undo them all: experience_bank undo --prune {run.pk}:{batch})"
        )

    def _undo(self, change: int | None, merge: int | None, prune: str | None, **_) -> None:
        if prune is not None:
            run_id, _, batch = prune.partition(":")
            n = services.prune_undo(self._run(int(run_id)), batch)
            self.stdout.write(f"prune {batch} undone: {n} entries back")
        elif merge is not None:
            services.merge_undo(Merge.objects.get(pk=merge))
            self.stdout.write(f"merge {merge} undone")
        elif change is not None:
            services.experience_undo(ExperienceChange.objects.get(pk=change))
            self.stdout.write(f"change {change} undone")
        else:
            raise CommandError("give a change id or --merge MERGE_ID")
