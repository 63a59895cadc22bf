"""The dashboard's pure chart helpers: which panel a trainer metric lands on, smoothing, bands, tables."""

from __future__ import annotations

import pytest

from webapp import charts


@pytest.mark.parametrize(
    ("kind", "key", "panel"),
    [
        ("train", "train/success", "success"),
        ("train", "train/guided/success", "success"),
        ("train", "train/free/reward", "reward"),
        ("train", "train/guided/actions", "actions"),
        ("train", "train/invalid_frac", "actions"),
        ("train", "actor/loss", "actor"),
        ("train", "adv/zero_groups_frac", "actor"),
        ("train", "extractor/clip_frac", "extractor"),
        ("train", "experience/retrieve_s", "retrieval"),
        ("train", "experience/search_and_ask_s", "retrieval"),
        ("train", "experience/search_and_ask", "bank"),
        ("train", "time/rollout_s", "time"),
        ("train", "engine/weight_version", "other"),
        ("eval", "eval/success", "eval-success"),
        ("eval", "eval/with_exp/ALFWorld/success", "eval-success"),
        ("eval", "eval/with_exp/actions", "eval-actions"),
        ("eval", "eval/exp_gain", "eval-other"),
    ],
)
def test_trainer_metrics_land_on_the_right_panel(kind, key, panel):
    assert charts.panel_of(kind, key).id == panel


def test_panels_for_keeps_catalogue_order_and_groups_keys():
    panels = charts.panels_for(
        {"train": ["time/step_s", "train/success", "train/free/success"], "eval": ["eval/success"]}
    )
    assert [(p["id"], p["keys"]) for p in panels] == [
        ("success", ["train/free/success", "train/success"]),
        ("eval-success", ["eval/success"]),
        ("time", ["time/step_s"]),
    ]


def test_ema_debiases_and_keeps_gaps():
    assert charts.ema([1.0, None, 1.0], 0.9) == [pytest.approx(1.0), None, pytest.approx(1.0)]
    assert charts.ema([0.0, 1.0], 0.0) == [0.0, 1.0]
    assert charts.ema([0.0, 1.0], 0.5) == [0.0, pytest.approx(0.5 / 0.75)]


def test_mean_band_aligns_runs_by_step():
    steps, mean, lo, hi = charts.mean_band([{0: 0.0, 1: 1.0}, {1: 0.0, 2: 4.0}])
    assert steps == [0, 1, 2] and mean == [0.0, 0.5, 4.0] and lo == [0.0, 0.0, 4.0] and hi == [0.0, 1.0, 4.0]


def test_histogram_bins_and_best_values():
    bins = charts.histogram([0.0, 0.0, 1.0], bins=2)
    assert [b["count"] for b in bins] == [2, 1] and bins[0]["frac"] == 1.0
    assert charts.final_and_best([0.2, None, 0.9, 0.5], "train/success") == (0.5, 0.9)
    assert charts.final_and_best([3.0, 1.0, 2.0], "actor/loss") == (2.0, 1.0)
    assert charts.final_and_best([None], "x") == (None, None)


def test_config_diff_shows_only_differing_dotted_keys():
    a = {"seed": 0, "actor": {"lr": 1e-5, "clip_eps": 0.2}}
    b = {"seed": 1, "actor": {"lr": 1e-5, "clip_eps": 0.3}}
    assert charts.config_diff([a, b]) == [("actor.clip_eps", [0.2, 0.3]), ("seed", [0, 1])]


def test_what_counts_as_better():
    assert charts.lower_is_better("actor/loss") and charts.lower_is_better("time/rollout_s")
    assert charts.lower_is_better("eval/with_exp/actions") and charts.lower_is_better("experience/retrieve_s")
    assert not charts.lower_is_better("experience/bank_size") and not charts.lower_is_better("train/success")
