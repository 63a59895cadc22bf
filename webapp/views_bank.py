"""Experience bank pages of a run: search and browse, an entry with its history, edits, pins, deletes, undo,
bulk prune with preview, merge history, JSONL export and import. Every write goes through
``experience.services`` (the manager's write path when the run is training in this process)."""

from __future__ import annotations

import io

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from experience import selectors as bank_selectors
from experience import services as bank_services
from experience.bank import BankError, EntryChanged, EntryDeleted
from experience.models import Experience, ExperienceChange, ImportJob, Merge
from webapp.forms import BankSearchForm, ExperienceForm, ImportForm, PruneForm, int_param
from webapp.models import Run
from webapp.selectors import (
    bank_entries,
    bank_entry,
    bank_search,
    bank_search_across,
    banks_overview,
    run_get,
)
from webapp.services import can_edit_bank

PRUNE_PREVIEW = 2000
"""Most entries one prune shows and deletes (prune again for more)."""
PRUNE_PAGE_ROWS = 50
"""Rows of a prune preview shown a page (the count and the button come first; the rows page)."""
BANKS_SEARCH_SIZE = 30
"""Most matches a search across all banks lists."""


def _editable_run(request: HttpRequest, run_id: int) -> Run:
    run = run_get(request.user, run_id)
    if not can_edit_bank(request.user, run):
        raise PermissionDenied("you may not edit this run's experience bank")
    return run


def bank(request: HttpRequest, run_id: int) -> HttpResponse:
    """The bank of a run; an htmx request (search as you type) gets just the list."""
    run = run_get(request.user, run_id)
    form = BankSearchForm(request.GET)
    data = form.cleaned_data if form.is_valid() else {}
    if form.errors:
        messages.error(request, "Some search options were not understood and were ignored.")
    search = bank_search(data.get("q", ""), data.get("mode") or "semantic")
    entries = bank_entries(
        run, q=data.get("q", ""), mode=search.mode, scope=data.get("scope", ""),
        sort=data.get("sort") or "recent", pinned=data.get("pinned", False),
    )  # fmt: skip
    context = {
        "search": search if data.get("q") else None,
        "run": run, "form": form, "entries": entries, "can_edit": can_edit_bank(request.user, run),
        "bank_size": Experience.objects.in_bank(run.pk).count(),
        "scopes": bank_selectors.experience_scopes(run),
        "unread_warning": unread_scopes_warning(run),
        "prune_form": PruneForm(), "import_form": ImportForm(),
        "last_prune": _last_prune(request, run),
        "import_jobs": bank_selectors.import_jobs(run)[:3], "limits": bank_selectors.IMPORT_LIMITS,
    }  # fmt: skip
    template = (
        "webapp/_bank_list.html"
        if request.htmx and request.htmx.target == "bank-list"
        else "webapp/bank.html"
    )
    return render(request, template, context)


def bank_entry_view(request: HttpRequest, run_id: int, entry_id: int) -> HttpResponse:
    """An entry: text, provenance, counters, history (with undo) and, for editors, the edit form."""
    run = run_get(request.user, run_id)
    entry = bank_entry(run, entry_id)
    can_edit = can_edit_bank(request.user, run)
    form = ExperienceForm(initial={"title": entry.title, "content": entry.content, "version": entry.version})
    status = 200
    if request.method == "POST":
        if not can_edit:
            raise PermissionDenied("you may not edit this run's experience bank")
        form = ExperienceForm(request.POST)
        status = _save_edit(request, entry, form)
        if status is None:
            messages.success(request, "Saved.")
            return redirect("bank_entry", run_id=run.id, entry_id=entry.id)
    history = list(bank_selectors.experience_history(entry))
    context = {
        "run": run, "entry": entry, "form": form, "can_edit": can_edit,
        "history": history, "undoable": undoable_changes(entry, history),
    }  # fmt: skip
    return render(request, "webapp/bank_entry.html", context, status=status)


def undoable_changes(entry: Experience, history: list[ExperienceChange]) -> set[int]:
    """The changes whose Undo would work now (the page offers no button that can only be refused): not
    undone, not an undo, and the entry still as the change left it; a merge's change also needs every
    entry of that merge as the merge left it (undoing it undoes the whole merge)."""
    out = set()
    for change in history:
        if change.undone_by_id or change.kind == ExperienceChange.Kind.UNDO:
            continue
        if (change.after or {}).get("version") != entry.version:
            continue
        if change.merge_id is not None and (change.merge.undone_at or not _merge_is_latest(change.merge)):
            continue
        out.add(change.pk)
    return out


def _merge_is_latest(merge: Merge) -> bool:
    """Every entry the merge touched is as the merge's last change of it left it."""
    last = {c.experience_id: c for c in merge.changes.select_related("experience").order_by("id")}
    return all((c.after or {}).get("version") == c.experience.version for c in last.values())


MISSING_VERSION = (
    "Not saved: the form did not say which version of the entry you edited, so saving it could overwrite "
    "newer text. Reload the entry to edit its current text; your text is kept below."
)


def _save_edit(request: HttpRequest, entry: Experience, form: ExperienceForm) -> int | None:
    """Save the edit (None), or the status to answer with the reason on the form: nothing is saved over
    text the person has not seen, and their text stays in the form."""
    if not form.is_valid():
        if "version" not in form.errors:
            return 400
        other_errors = set(form.errors) != {"version"}
        form.add_error(None, MISSING_VERSION)
        return 400 if other_errors else 409
    data = form.cleaned_data
    try:
        bank_services.experience_edit(
            entry, data["title"], data["content"], user=request.user, expected_version=data["version"]
        )
    except BankError as err:
        entry.refresh_from_db()
        form.add_error(None, _refusal("Not saved", err, entry))
        return 409
    return None


def _refusal(what: str, err: BankError, entry: Experience) -> str:
    """Why a write to ``entry`` was refused and what to do, for the page."""
    kept = " Your text is kept below." if what == "Not saved" else ""
    if isinstance(err, EntryDeleted):
        return f"{what}: this entry was deleted (Undo next to its deletion in the history restores it).{kept}"
    if isinstance(err, EntryChanged):
        return (f"{what}: this entry changed since you opened it (it is now version {err.version}). "
                f"Its text now: “{entry.title}: {entry.content[:500]}”. Reload to see the new text "
                f"and try again.{kept}")  # fmt: skip
    return f"{what}: {err}."


@require_POST
def bank_pin(request: HttpRequest, run_id: int, entry_id: int) -> HttpResponse:
    """Pin or unpin (from the entry page, or a bank row swapped by htmx); refused, with the reason, when the
    entry was deleted or changed since the page showed it (its ``version``)."""
    run = _editable_run(request, run_id)
    entry = bank_entry(run, entry_id)
    version = int_param(request.POST, "version", min_value=1)
    pinned = request.POST.get("pinned") == "1"
    error, status = "", 200
    try:
        entry = bank_services.experience_pin(entry, pinned, user=request.user, expected_version=version)
    except BankError as err:
        entry.refresh_from_db()
        error, status = _refusal("Not pinned" if pinned else "Not unpinned", err, entry), 409
    if request.htmx and request.htmx.target == f"entry-{entry.id}":
        context = {"run": run, "entry": entry, "can_edit": True, "error": error}
        return render(request, "webapp/_bank_row.html", context, status=status)
    if error:
        messages.error(request, error)
    return redirect("bank_entry", run_id=run.id, entry_id=entry.id)


@require_POST
def bank_delete(request: HttpRequest, run_id: int, entry_id: int) -> HttpResponse:
    run = _editable_run(request, run_id)
    entry = bank_entry(run, entry_id)
    version = int_param(request.POST, "version", min_value=1)
    try:
        bank_services.experience_delete(entry, user=request.user, expected_version=version)
    except BankError as err:
        entry.refresh_from_db()
        messages.error(request, _refusal("Not deleted", err, entry))
        return redirect("bank_entry", run_id=run.id, entry_id=entry.id)
    messages.success(request, f"Deleted “{entry.title}”. Its history can undo this.")
    return redirect("bank_entry", run_id=run.id, entry_id=entry.id)


@require_POST
def bank_undo(request: HttpRequest, run_id: int, change_id: int) -> HttpResponse:
    """Undo one change of an entry (a change made by a merge undoes the whole merge)."""
    run = _editable_run(request, run_id)
    change = get_object_or_404(ExperienceChange, pk=change_id, run=run)
    try:
        bank_services.experience_undo(change, user=request.user)
        messages.success(request, f"Undid the {change.get_kind_display()}.")
    except BankError as err:
        messages.error(request, str(err))
    return redirect("bank_entry", run_id=run.id, entry_id=change.experience_id)


def bank_prune(request: HttpRequest, run_id: int) -> HttpResponse:
    """GET: the rule's preview (what would go). POST with confirm: delete exactly the previewed entries (a
    running run may have changed what the rule matches since), as one action that can be undone whole."""
    run = _editable_run(request, run_id)
    form = PruneForm(request.POST if request.method == "POST" else request.GET)
    if not form.is_valid():
        return render(request, "webapp/bank_prune.html", {"run": run, "form": form}, status=400)
    if request.method == "POST" and form.cleaned_data["confirm"]:
        n, batch = bank_services.experience_prune(run, form.confirmed_ids(), user=request.user)
        messages.success(request, f"Pruned {n} entr{'y' if n == 1 else 'ies'}.")
        request.session["last_prune"] = {"run": run.id, "batch": batch, "n": n}
        return redirect("bank", run_id=run.id)
    preview = list(bank_selectors.experience_prune_preview(run, form.rule())[:PRUNE_PREVIEW])
    ids = ",".join(str(e.pk) for e in preview)
    rows = Paginator(preview, PRUNE_PAGE_ROWS).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "run": run, "form": form, "preview": preview, "ids": ids, "limit": PRUNE_PREVIEW, "rows": rows,
        "query": query.urlencode(),
    }  # fmt: skip
    return render(request, "webapp/bank_prune.html", context)


def _last_prune(request: HttpRequest, run: Run) -> dict | None:
    last = request.session.get("last_prune")
    return last if last and last.get("run") == run.id else None


@require_POST
def bank_prune_undo(request: HttpRequest, run_id: int) -> HttpResponse:
    """Bring back every entry of one prune (its id is in the confirmation message's undo button)."""
    run = _editable_run(request, run_id)
    batch = request.POST.get("batch", "")
    try:
        n = bank_services.prune_undo(run, batch, user=request.user)
        messages.success(request, f"Undid the prune: {n} entr{'y' if n == 1 else 'ies'} back.")
    except BankError as err:
        messages.error(request, f"Nothing was undone: {err}")
    request.session.pop("last_prune", None)
    return redirect("bank", run_id=run.id)


def bank_merges(request: HttpRequest, run_id: int) -> HttpResponse:
    run = run_get(request.user, run_id)
    merges = list(bank_selectors.merge_list(run)[:200])
    context = {
        "run": run, "merges": merges, "can_edit": can_edit_bank(request.user, run),
        "undoable": undoable_merges(merges),
    }  # fmt: skip
    return render(request, "webapp/bank_merges.html", context)


def undoable_merges(merges: list[Merge]) -> set[int]:
    """The merges whose Undo would work now: changed something, not undone, and every entry they touched
    still as they left it (one query for the page)."""
    candidates = [m.pk for m in merges if m.undone_at is None and m.decision == "changed"]
    rows = (
        ExperienceChange.objects.filter(merge_id__in=candidates)
        .order_by("id")
        .values_list("merge_id", "experience_id", "after__version", "experience__version")
    )
    last = {(merge, entry): left == now for merge, entry, left, now in rows}
    stale = {merge for (merge, _), latest in last.items() if not latest}
    return {pk for pk in candidates if pk not in stale}


@require_POST
def bank_merge_undo(request: HttpRequest, run_id: int, merge_id: int) -> HttpResponse:
    run = _editable_run(request, run_id)
    merge = get_object_or_404(Merge, pk=merge_id, run=run)
    try:
        bank_services.merge_undo(merge, user=request.user)
        messages.success(request, f"Undid merge #{merge.id}.")
    except BankError as err:
        messages.error(request, str(err))
    return redirect("bank_merges", run_id=run.id)


def bank_export(request: HttpRequest, run_id: int) -> HttpResponse:
    """The bank as JSONL (entries with provenance, counters and embeddings)."""
    run = run_get(request.user, run_id)
    scope = request.GET.get("scope") or None
    if scope is not None and ("\x00" in scope or len(scope) > 100):
        return HttpResponse("scope must be a bank scope name (at most 100 characters)", status=400)
    out = io.StringIO()
    bank_services.experience_export(run, out, scope=scope)
    response = StreamingHttpResponse(iter([out.getvalue()]), content_type="application/jsonl")
    response["Content-Disposition"] = f'attachment; filename="bank-run-{run.id}.jsonl"'
    return response


@require_POST
def bank_import(request: HttpRequest, run_id: int) -> HttpResponse:
    """Add the entries of a JSONL export: all or nothing, with a message saying what was wrong. A small
    file is imported within the request; a larger one is handed to a worker and its progress shown."""
    run = _editable_run(request, run_id)
    form = ImportForm(request.POST, request.FILES)
    if not form.is_valid():
        errors = " ".join(e for es in form.errors.values() for e in es)
        messages.error(request, f"Nothing was imported: {errors}")
        return redirect("bank", run_id=run.id)
    upload = form.cleaned_data["file"]
    job = bank_services.import_upload(run, upload, user=request.user)
    if job.status == ImportJob.Status.QUEUED:
        messages.info(request, f"Importing {upload.name} in the background: progress under Import.")
    elif job.status == ImportJob.Status.FAILED:
        reason = job.error
        messages.error(
            request, f"Nothing was imported: the file is not a valid experience export ({reason})."
        )
    else:
        n = job.entries
        messages.success(request, f"Imported {n} entr{'y' if n == 1 else 'ies'}.")
        if warning := unread_scopes_warning(run):
            messages.warning(request, warning)
    return redirect("bank", run_id=run.id)


def unread_scopes_warning(run: Run) -> str:
    """What the bank page and an import say of entries in scopes no episode of the run retrieves from ("" when
    there are none)."""
    unread = bank_selectors.unread_scopes(run)
    if not unread:
        return ""
    counts = ", ".join(f"{scope}: {n}" for scope, n in unread.items())
    read = " and ".join(sorted(bank_selectors.scopes_read_by(run) or ()))
    return (
        f"{sum(unread.values())} entries are in a scope no episode of this run retrieves from ({counts}); "
        f"its episodes read {read}. Export them for a run of that environment, or delete them."
    )


@require_POST
def bank_import_cancel(request: HttpRequest, run_id: int, job_id: int) -> HttpResponse:
    """Stop an import before it writes anything (``experience.services.import_job_cancel``)."""
    run = _editable_run(request, run_id)
    job = get_object_or_404(ImportJob, pk=job_id, run=run)
    try:
        done = bank_services.import_job_cancel(job)
    except BankError as err:
        messages.error(request, f"Not cancelled: {err}.")
    else:
        what = "cancelled" if done == "cancelled" else "stopping: nothing of it will be imported"
        messages.success(request, f"Import of {job.file_name or 'the file'} {what}.")
    return redirect("bank", run_id=run.id)


@require_GET
def bank_import_job(request: HttpRequest, run_id: int, job_id: int) -> HttpResponse:
    """One import's progress (the bank page polls it until the import has finished)."""
    run = _editable_run(request, run_id)
    job = get_object_or_404(ImportJob, pk=job_id, run=run)
    context = {"run": run, "job": job, "polled": True}
    if job.finished:  # the page's counts, out of band: no reload needed to see the new size
        context["bank_size"] = Experience.objects.in_bank(run.pk).count()
        context["unread_warning"] = unread_scopes_warning(run)
    return render(request, "webapp/_import_job.html", context)


def banks(request: HttpRequest) -> HttpResponse:
    """Every bank this user may see, and a search across all of them."""
    form = BankSearchForm(request.GET)
    runs = banks_overview(request.user)
    data = form.cleaned_data if form.is_valid() else {}
    q = data.get("q", "")
    search = bank_search(q, data.get("mode") or "semantic", limit=BANKS_SEARCH_SIZE)
    hits = bank_search_across(runs, q, mode=search.mode, limit=BANKS_SEARCH_SIZE) if q else []
    context = {"form": form, "runs": runs, "hits": hits, "q": q, "search": search}
    return render(request, "webapp/banks.html", context)
