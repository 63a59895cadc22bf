"""The dashboard's pure chart helpers: which panel a trainer metric lands on, smoothing, bands, tables."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainer.experiments.stats import t_interval
from webapp import charts


@pytest.mark.parametrize(
    ("kind", "key", "panel"),
    [
        ("train", "train/success", "success"),
        ("train", "train/guided/success", "success"),
        ("train", "train/guided/MiniHack-Room-15x15/success", "success"),
        ("train", "train/WebShop-synth/reward", "reward"),
        ("train", "train/free/ALFWorld/truncated_frac", "actions"),
        ("train", "train/free/reward", "reward"),
        ("train", "train/guided/actions", "actions"),
        ("train", "train/invalid_frac", "actions"),
        ("train", "bank/size", "bank-size"),
        ("train", "experience/bank_size", "bank-size"),
        ("train", "rollout/tokens_per_s", "rollout"),
        ("train", "actor/loss", "actor"),
        ("train", "adv/zero_groups_frac", "actor"),
        ("train", "extractor/clip_frac", "extractor"),
        ("train", "experience/retrieve_s", "retrieval"),
        ("train", "experience/search_and_ask_s", "retrieval"),
        ("train", "experience/search_and_ask", "bank"),
        ("train", "time/rollout_s", "time"),
        ("train", "engine/weight_version", "rollout"),
        ("train", "something/new", "other"),
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
        {
            "train": ["time/rollout_s", "time/step_s", "train/success", "train/free/success", "actor/loss"],
            "eval": ["eval/success"],
        }
    )
    assert [(p["id"], p["section"], p["keys"]) for p in panels] == [
        ("success", "", ["train/success", "train/free/success"]),
        ("eval-success", "", ["eval/success"]),
        ("time", "", ["time/step_s", "time/rollout_s"]),
        ("actor", "Actor", ["actor/loss"]),
    ]


def test_the_default_panels_answer_is_it_learning_and_the_rest_is_folded_by_subsystem():
    defaults = [p.id for p in charts.PANELS if not p.section]
    assert defaults == ["success", "eval-success", "reward", "bank-size", "time"]
    assert {p.section for p in charts.PANELS if p.section} == {
        "Actor", "Evaluation", "Experience bank and extractor", "Rollout and engine", "Other",
    }  # fmt: skip


def test_a_mixture_panel_lists_the_overall_curves_first():
    envs = ["ALFWorld", "Sokoban-6x6", "WebShop-synth"]
    keys = [f"eval/{e}/success" for e in envs] + [f"eval/with_exp/{e}/success" for e in envs]
    (panel,) = charts.panels_for({"eval": [*keys, "eval/with_exp/success", "eval/success"]})
    assert panel["keys"][:2] == ["eval/success", "eval/with_exp/success"]
    assert len(panel["keys"]) == 8 > charts.MAX_SERIES  # the page draws MAX_SERIES, the legend the rest


def test_a_three_point_series_is_drawn_unsmoothed_whatever_the_weight():
    bank_size = [9.0, 27.0, 45.0]
    assert charts.smooth(bank_size, 0.9) == bank_size
    assert charts.smooth(bank_size, 0.0) == bank_size
    long = [float(i) for i in range(charts.SMOOTH_MIN_POINTS)]
    assert charts.smooth(long, 0.0) == long
    assert charts.smooth(long, 0.6) == charts.ema(long, 0.6) != long


def test_ema_debiases_and_keeps_gaps():
    assert charts.ema([1.0, None, 1.0], 0.9) == [pytest.approx(1.0), None, pytest.approx(1.0)]
    assert charts.ema([0.0, 1.0], 0.0) == [0.0, 1.0]
    assert charts.ema([0.0, 1.0], 0.5) == [0.0, pytest.approx(0.5 / 0.75)]


def test_mean_band_aligns_seeds_by_step_with_a_t_interval():
    steps, mean, lo, hi = charts.mean_band([{0: 0.0, 1: 1.0}, {1: 0.0, 2: 4.0}, {1: 0.5}])
    assert steps == [0, 1, 2] and mean == [0.0, 0.5, 4.0]
    band = t_interval([1.0, 0.0, 0.5])  # step 1: three seeds; steps 0 and 2: one, so no band
    assert lo == [None, pytest.approx(band.low), None] and hi == [None, pytest.approx(band.high), None]
    assert band.low == pytest.approx(0.5 - 4.303 * 0.5 / 3**0.5, abs=1e-3)


def test_compare_defaults_to_the_short_set_and_groups_seeds_of_one_arm():
    present = [("eval", "eval/success"), ("train", "actor/loss"), ("train", "train/success")]
    assert charts.default_metrics(present) == [("train", "train/success"), ("eval", "eval/success")]
    assert charts.default_metrics([("train", "actor/loss")]) == [("train", "actor/loss")]
    seeds = [SimpleNamespace(experiment_id=1, cell=f"grpo/s{i}") for i in range(2)]
    other = SimpleNamespace(experiment_id=1, cell="complementary/s0")
    assert charts.default_group([*seeds, other]) == "seeds"
    assert charts.default_group([seeds[0], other]) == ""
    assert charts.default_group([SimpleNamespace(experiment_id=None, cell="")] * 2) == ""


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
