from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from webapp import (
    metrics,
    views,
    views_bank,
    views_compare,
    views_experiments,
    views_guide,
    views_inspect,
    views_runs,
)

handler400 = "webapp.views.bad_request"

urlpatterns = [
    path("", views.home, name="home"),
    path("workers/", views.workers, name="workers"),
    path("runs/launch/", views_runs.run_launch_view, name="run_launch"),
    path("runs/launch/plan/", views_runs.run_launch_plan, name="run_launch_plan"),
    path("runs/<int:run_id>/", views_runs.run_detail, name="run_detail"),
    path("runs/<int:run_id>/cancel/", views_runs.run_cancel_view, name="run_cancel"),
    path("runs/<int:run_id>/resume/", views_runs.run_resume_view, name="run_resume"),
    path("runs/<int:run_id>/episodes/", views_inspect.run_inspect, name="run_inspect"),
    path("bank/", views_bank.banks, name="banks"),
    path("runs/<int:run_id>/bank/", views_bank.bank, name="bank"),
    path("runs/<int:run_id>/bank/<int:entry_id>/", views_bank.bank_entry_view, name="bank_entry"),
    path("runs/<int:run_id>/bank/<int:entry_id>/pin/", views_bank.bank_pin, name="bank_pin"),
    path("runs/<int:run_id>/bank/<int:entry_id>/delete/", views_bank.bank_delete, name="bank_delete"),
    path("runs/<int:run_id>/bank/changes/<int:change_id>/undo/", views_bank.bank_undo, name="bank_undo"),
    path("runs/<int:run_id>/bank/prune/", views_bank.bank_prune, name="bank_prune"),
    path("runs/<int:run_id>/bank/prune/undo/", views_bank.bank_prune_undo, name="bank_prune_undo"),
    path("runs/<int:run_id>/bank/merges/", views_bank.bank_merges, name="bank_merges"),
    path(
        "runs/<int:run_id>/bank/merges/<int:merge_id>/undo/",
        views_bank.bank_merge_undo,
        name="bank_merge_undo",
    ),
    path("runs/<int:run_id>/bank/export/", views_bank.bank_export, name="bank_export"),
    path("runs/<int:run_id>/bank/import/", views_bank.bank_import, name="bank_import"),
    path("runs/<int:run_id>/bank/import/<int:job_id>/", views_bank.bank_import_job, name="bank_import_job"),
    path(
        "runs/<int:run_id>/bank/import/<int:job_id>/cancel/",
        views_bank.bank_import_cancel,
        name="bank_import_cancel",
    ),
    path("compare/", views_compare.compare, name="compare"),
    path("guide/", views_guide.guide, name="guide"),
    path("guide/<slug:page>/", views_guide.guide, name="guide_page"),
    path("experiments/", views_experiments.experiments, name="experiments"),
    path("experiments/<slug:name>/", views_experiments.experiment_detail, name="experiment_detail"),
    path(
        "experiments/<slug:name>/report/<str:filename>",
        views_experiments.experiment_report_file,
        name="experiment_report_file",
    ),
    path("compare/csv/", views_compare.compare_csv, name="compare_csv"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("api.urls")),  # the account page and /api/v1/
    path("admin/", admin.site.urls),
    path("metrics", metrics.metrics_view, name="metrics"),  # Prometheus' default path: no slash
]

handler500 = "webapp.views_errors.server_error"  # a full connection pool answers 503, not 500
