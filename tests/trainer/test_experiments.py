"""Experiment files, the statistics of reports (against scipy.stats) and reports built from result files."""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
from scipy import stats

from trainer.config import ConfigError, get_preset
from trainer.experiments.bank import BankReplay, agreement, entry_quality, shares, sizes_after
from trainer.experiments.report import build_report
from trainer.experiments.report.experience import (
    EXTRACTED,
    IMPORTED,
    entry_usefulness,
    imported_entries,
    origin_lines,
    usefulness_by_origin,
)
from trainer.experiments.report.merges import merge_effects
from trainer.experiments.report.quality import bank_replay
from trainer.experiments.report.runs import RunResult, load_results
from trainer.experiments.report.same_slot import same_draw, same_slot_pairs
from trainer.experiments.spec import ExperimentSpec
from trainer.experiments.stats import (
    area_under_curve,
    mcnemar_exact,
    steps_to_reach,
    t_interval,
    welch_interval,
    wilson_interval,
)
from trainer.loop import sample_tasks
from trainer.report import EpisodeLogReporter
from trainer.rollout.runner import Episode
from trainer.runfiles import last_attempt, read_lines, write_lines

REPO = Path(__file__).resolve().parents[2]


def spec_of(**data) -> ExperimentSpec:
    base = {"name": "grid", "base": "cpu", "methods": ["grpo", "complementary"], "seeds": [0, 1]}
    return ExperimentSpec.from_dict(base | data, folder=REPO / "configs" / "experiments")


# ---- the experiment file ----------------------------------------------------------------------------


def test_every_shipped_experiment_file_loads_with_one_budget_for_every_cell():
    files = sorted((REPO / "configs" / "experiments").glob("*.toml"))
    assert files
    for path in files:
        spec = ExperimentSpec.from_file(path)
        cells = spec.cells()
        assert len(cells) == len(spec.arms) * len(spec.seeds)
        for key, value in spec.budget.items():
            section, _, leaf = key.rpartition(".")
            for c in cells:
                node = c.config.to_dict()
                node = node[section] if section else node
                assert node[leaf] == value, (path.name, c.key, key)
        assert len({c.key for c in cells}) == len(cells)


def test_cells_are_the_base_then_budget_then_method_and_seed():
    spec = spec_of(budget={"steps": 3, "k_rollouts": 4}, set={"env": "Sokoban-6x6"})
    cells = {c.key: c for c in spec.cells()}
    assert list(cells) == ["grpo/s0", "complementary/s0", "grpo/s1", "complementary/s1"]  # seed by seed
    c = cells["complementary/s1"]
    assert (c.config.method, c.config.seed, c.config.steps, c.config.k_rollouts) == ("complementary", 1, 3, 4)
    assert c.config.env == "Sokoban-6x6" and c.slug == "complementary-s1"


def test_a_variant_gets_its_own_arm_and_may_not_change_the_budget():
    spec = spec_of(
        budget={"steps": 3},
        variants=[{"name": "curated", "method": "static_online", "bank": "room-curated.jsonl"}],
    )
    curated = [c for c in spec.cells() if c.arm == "curated"]
    assert [c.seed for c in curated] == [0, 1] and curated[0].bank.name == "room-curated.jsonl"
    with pytest.raises(ConfigError, match="same budget"):
        spec_of(budget={"steps": 3}, variants=[{"name": "v", "method": "grpo", "set": {"steps": 9}}])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "Bad Name"}, "name must be"),
        ({"methods": ["ppo"]}, "not one of"),
        ({"seeds": [0, 0]}, "seeds must be distinct"),
        ({"seeds": [-1]}, "seeds must be distinct"),
        ({"budget": {"actor.lr": 1.0}}, "not budget"),
        ({"budget": {"k_rollouts": 1}}, "cell grpo/s0: k_rollouts must be at least 2"),
        ({"colour": "red"}, "unknown experiment keys"),
        ({"variants": [{"name": "v", "method": "static_online", "bank": "nope.jsonl"}]}, "does not exist"),
        ({"methods": [], "variants": []}, "at least one method"),
        ({"set": {"seed": 3}}, "may not name method or seed"),
    ],
)
def test_a_bad_experiment_file_is_refused_with_a_clear_message(data, message):
    with pytest.raises(ConfigError, match=message):
        spec_of(**data)


# ---- statistics ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values", [[0.1, 0.5, 0.3], [0.75, 0.8], [1.0, 1.0, 1.0], [0.2, 0.4, 0.9, 0.35, 0.6]]
)
def test_the_t_interval_is_scipys(values):
    iv = t_interval(values)
    assert iv.mean == pytest.approx(sum(values) / len(values)) and iv.n == len(values)
    sem = stats.sem(values)
    if sem == 0:  # every seed equal: scipy's interval is undefined, ours has zero width
        assert iv.low == iv.high == pytest.approx(iv.mean)
        return
    low, high = stats.t.interval(0.95, len(values) - 1, loc=iv.mean, scale=sem)
    assert (iv.low, iv.high) == (pytest.approx(low), pytest.approx(high))


def test_one_seed_has_no_interval():
    iv = t_interval([0.4])
    assert iv.mean == 0.4 and math.isnan(iv.low) and str(iv) == "0.400 (n=1)"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([0.3, 0.27], [0.39, 0.72, 0.95]),
        ([0.1, 0.2, 0.4], [0.5, 0.5, 0.6]),
        ([0.9, 0.8, 0.85, 0.7], [0.2, 0.6]),
    ],
)
def test_the_welch_interval_is_scipys(a, b):
    iv = welch_interval(a, b)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert iv.mean == pytest.approx(sum(a) / len(a) - sum(b) / len(b))
    assert (iv.low, iv.high) == (pytest.approx(ci.low), pytest.approx(ci.high))


def test_a_difference_needs_two_seeds_each_and_equal_seeds_give_a_point():
    assert math.isnan(welch_interval([0.4], [0.1, 0.2]).low)
    iv = welch_interval([0.4, 0.4], [0.1, 0.1])
    assert (iv.low, iv.mean, iv.high) == pytest.approx((0.3, 0.3, 0.3))


@pytest.mark.parametrize(("k", "n"), [(0, 64), (5, 64), (32, 64), (64, 64), (7, 10)])
def test_the_wilson_interval_is_scipys(k, n):
    iv = wilson_interval(k, n)
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert (iv.low, iv.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert iv.mean == pytest.approx(k / n)


@pytest.mark.parametrize(
    ("only_a", "only_b", "p"), [(0, 0, 1.0), (2, 0, 0.5), (1, 9, 22 / 1024), (5, 5, 1.0)]
)
def test_mcnemars_exact_p_is_the_two_sided_binomial_tail_of_the_discordant_pairs(only_a, only_b, p):
    assert mcnemar_exact(only_a, only_b) == pytest.approx(p)
    assert mcnemar_exact(only_b, only_a) == pytest.approx(p)


def test_auc_is_the_mean_of_the_curve_over_its_steps_and_thresholds_find_the_first_step():
    assert area_under_curve([0, 10, 20], [0.0, 0.5, 1.0]) == pytest.approx(0.5)
    assert area_under_curve([0, 10], [0.2, 0.2]) == pytest.approx(0.2)
    assert area_under_curve([5], [0.3]) == 0.3
    assert steps_to_reach([0, 10, 20], [0.1, 0.6, 0.8], 0.5) == 10
    assert steps_to_reach([0, 10, 20], [0.1, 0.6, 0.7], 0.75) is None


# ---- result files --------------------------------------------------------------------------------------


def test_a_resumed_runs_repeated_steps_keep_only_their_last_attempt(tmp_path):
    rows = [{"kind": "eval", "step": 0, "v": 0}, {"kind": "step", "step": 1, "v": 1}]
    rows += [{"kind": "step", "step": 2, "v": "first"}, {"kind": "step", "step": 3, "v": "lost"}]
    rows += [{"kind": "step", "step": 2, "v": "again"}, {"kind": "step", "step": 3, "v": 3}]
    kept = last_attempt(rows)
    assert [(r["step"], r["v"]) for r in kept] == [(0, 0), (1, 1), (2, "again"), (3, 3)]
    episodes = [{"step": 1, "i": 0}, {"step": 1, "i": 1}, {"step": 2, "i": 0}, {"step": 1, "i": 9}]
    assert [r["i"] for r in last_attempt(episodes)] == [9, 0]
    path = tmp_path / "m.jsonl"
    write_lines(path, kept)
    path.write_text(path.read_text() + '{"kind": "step", "st')  # a line cut by a crash
    assert read_lines(path) == kept


# ---- reports --------------------------------------------------------------------------------------------


def _episodes(rng: random.Random, steps: int, guided_rate: float, free_rate: float) -> list[dict]:
    out = []
    for step in range(1, steps + 1):
        for group in range(2):
            for k in range(4):
                guided = k < 2
                rate = guided_rate if guided else free_rate
                out.append(
                    {
                        "step": step,
                        "env": "E",
                        "seed": group,
                        "group": group,
                        "guided": guided,
                        "entry_id": (1 + k % 2) if guided else None,
                        "entry_version": 1,
                        "similarity": 0.5 if guided else None,
                        "success": rng.random() < rate,
                        "reward": 0.0,
                        "actions": 3,
                        "searches": 0,
                    }
                )
    return out


def write_fake_grid(folder: Path, steps: int = 4) -> None:
    """Two arms × two seeds of result files shaped as ``export_results`` writes them."""
    rng = random.Random(0)
    for method in ("grpo", "complementary"):
        for seed in (0, 1):
            d = folder / "runs" / f"{method}-s{seed}"
            d.mkdir(parents=True)
            (d / "cell.json").write_text(
                json.dumps({"cell": f"{method}/s{seed}", "method": method, "status": "succeeded"})
            )
            (d / "config.json").write_text(json.dumps({"method": method, "experience": {"warmup_steps": 1}}))
            rows = []
            for step in (0, 2, 4):
                row = {
                    "kind": "eval",
                    "step": step,
                    "eval/success": 0.1 * step + 0.05 * seed,
                    "eval/episodes": 64,
                }
                if method != "grpo":
                    row |= {"eval/with_exp/success": 0.12 * step, "eval/with_exp/episodes": 64}
                rows.append(row | {"eval/time_s": 10.0})
            for step in range(1, steps + 1):
                row = {
                    "kind": "step",
                    "step": step,
                    "train/success": 0.25 * (step - 1) + 0.1 * seed,
                    "time/step_s": 30.0,
                    "time/rollout_s": 10.0,
                    "time/backward_s": 15.0,
                    "rollout/generated_tokens": 100,
                }
                if method != "grpo":
                    row |= {
                        "train/guided/success": 0.3,
                        "train/free/success": 0.2,
                        "extractor/buffer": step % 3,
                        "extractor/updates": step,
                        "extractor/updates_with_signal": step - 1,
                        "extractor/adv_abs_sum": 0.5 * step,
                        "extractor/clip_frac_sum": 0.0,
                        "extractor/distil_calls": 16 * step,
                        "extractor/merges": step // 2,
                        "extractor/merges_coalesced": 1 if step > 2 else 0,
                        "extractor/distil_tokens": 900 * step,
                        "extractor/update_s": 4.0 * step,
                        "bank/size": 2,
                    }
                rows.append(row)
            write_lines(d / "metrics.jsonl", rows)
            if method != "grpo":
                write_lines(d / "episodes.jsonl", _episodes(rng, steps, 0.6, 0.2))
                write_lines(
                    d / "changes.jsonl",
                    [
                        {
                            "id": 1,
                            "entry": 1,
                            "kind": "add",
                            "step": 1,
                            "title": "Go southeast to >",
                            "content": "move southeast toward the staircase",
                            "deleted": False,
                        },
                        {
                            "id": 2,
                            "entry": 2,
                            "kind": "add",
                            "step": 1,
                            "title": "Nothing happened.",
                            "content": "{{lessonEnd}} .",
                            "deleted": False,
                        },
                        {
                            "id": 3,
                            "entry": 3,
                            "kind": "merge_add",
                            "step": 2,
                            "title": "Walk to the stairs",
                            "content": "go toward > in its compass direction",
                            "deleted": False,
                        },
                        {
                            "id": 4,
                            "entry": 2,
                            "kind": "merge_remove",
                            "step": 2,
                            "title": "",
                            "content": "",
                            "deleted": True,
                        },
                    ],
                )
                write_lines(
                    d / "merges.jsonl",
                    [
                        {
                            "id": 1,
                            "scope": "E",
                            "step": 2,
                            "chunk": 0,
                            "decision": "changed",
                            "inputs": [1, 2],
                            "outputs": [3],
                            "actions": [],
                        }
                    ],
                )


def test_a_report_has_every_section_plots_and_a_summary(tmp_path):
    write_fake_grid(tmp_path)
    out = build_report(tmp_path)
    md = (out / "report.md").read_text()
    for heading in (
        "## 1. Evaluation success",
        "## 2. Final evaluation in the paper's Table 1 layout",
        "## 3. What the experience did",
        "### Guided vs free",
        "### Entries: success when retrieved",
        "### Same slot, with and without the entry",
        "### Merge passes",
        "### Bank quality: the bank as it was",
        "## 4. What the extractor did",
        "## 5. Cost",
    ):
        assert heading in md, heading
    for png in ("eval_success.png", "guided_free.png", "bank_quality.png", "extractor.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert {(r["run"], r["column"]) for r in rows} >= {
        ("grpo-s0", "without experience"),
        ("complementary-s1", "with experience"),
    }
    final = {(r["run"], r["column"]): float(r["final_success"]) for r in rows}
    assert final[("grpo-s1", "without experience")] == pytest.approx(0.45)
    # the seed-mean of grpo's final success is 0.425 with a t-interval over its 2 seeds
    expected = t_interval([0.4, 0.45])
    assert f"{expected.mean:.3f} ± {expected.half_width:.3f}" in md
    # differences: complementary's w/o column equals grpo's finals (0.4, 0.45), its w/ column is 0.48 in both
    # seeds; with − without within complementary is 0.08 and 0.03 per run
    assert "| complementary (without experience) − grpo | +0.000 | [" in md
    w = welch_interval([0.48, 0.48], [0.4, 0.45])
    assert (
        f"| complementary (with experience) − grpo | +0.055 | [{w.low:+.3f}, {w.high:+.3f}] | no | 2 vs 2 |"
        in md
    )
    g = t_interval([0.08, 0.03])
    assert (
        f"| complementary: with − without experience | +0.055 | [{g.low:+.3f}, {g.high:+.3f}] | no "
        "| 2 paired |" in md
    )
    # how soon training succeeds: seed 0 at 0, .25, .5, .75 over steps 1-4; seed 1 at .1, .35, .6, .85
    first = t_interval([2, 1])
    assert f"| grpo | {first.mean:.1f} ± {first.half_width:.1f} (2/2) | 3.0 ± 0.0 (2/2) | never (0/2) |" in md
    assert "| complementary-s0 | 2 | 3 | – |" in md and "| complementary-s1 | 1 | 3 | – |" in md
    # merge passes from the journal (one pass at step 2, one attempt), requests coalesced from the metrics
    assert "| passes (attempts; coalesced) |" in md and "| 1 (1; 1) |" in md
    # the criterion over the arm: 3 CISPO steps with signal in each run's 3 steps after its 1 warm-up step
    assert "- complementary: 6 CISPO steps with signal over 6 actor steps after warm-up = 1.00 pooled" in md


def test_results_load_in_method_order_with_their_last_rows(tmp_path):
    write_fake_grid(tmp_path)
    runs = load_results(tmp_path)
    assert [r.slug for r in runs] == ["grpo-s0", "grpo-s1", "complementary-s0", "complementary-s1"]
    assert sorted(runs[0].evals) == [0, 2, 4] and runs[2].warmup == 1


def test_usefulness_is_success_when_retrieved_minus_the_free_base_rate_of_the_same_instances():
    def ep(step, group, guided, success, entry=None):
        return {"step": step, "group": group, "guided": guided, "success": success, "entry_id": entry}

    episodes = [
        ep(1, 0, False, True),
        ep(1, 0, False, False),
        ep(1, 0, True, True, 7),
        ep(1, 0, True, False, 8),
    ]
    episodes += [ep(1, 1, False, False), ep(1, 1, False, False), ep(1, 1, True, True, 7)]
    use = entry_usefulness(episodes)
    assert use[7] == [pytest.approx(0.5), pytest.approx(1.0)] and use[8] == [pytest.approx(-0.5)]


def test_usefulness_splits_by_whether_a_person_or_the_extractor_wrote_the_entry():
    def ep(group, guided, success, entry=None):
        return {"step": 1, "group": group, "guided": guided, "success": success, "entry_id": entry}

    run = RunResult(
        slug="static_online-s0",
        arm="static_online",
        seed=0,
        method="static_online",
        config={},
        train={},
        evals={},
        episodes=[ep(0, False, False), ep(0, True, True, 1), ep(0, True, False, 2), ep(0, True, True, 2)],
        changes=[
            {"entry": 1, "kind": "import", "step": 0},
            {"entry": 2, "kind": "add", "step": 1},
            {"entry": 2, "kind": "update", "step": 1},
        ],
    )
    assert imported_entries(run.changes) == {1}
    split = usefulness_by_origin(run)
    assert split[IMPORTED] == [1.0] and split[EXTRACTED] == [0.0, 1.0]
    assert "imported (written by a person)" in "\n".join(origin_lines([run]))
    assert origin_lines([replace(run, changes=run.changes[1:])]) == []


def _slot_run(tmp_path: Path, method: str, outcomes: dict[int, list[tuple]], trained_at: int) -> None:
    """A run of seed 0 whose step s has one task instance with rollouts ``outcomes[s]``: (success, actions,
    entry or None); the actor first trains a row at step ``trained_at``."""
    d = tmp_path / "runs" / f"{method}-s0"
    d.mkdir(parents=True)
    (d / "cell.json").write_text(json.dumps({"cell": f"{method}/s0", "method": method}))
    rows = [{"kind": "step", "step": s, "actor/sequences": float(s >= trained_at)} for s in outcomes]
    write_lines(d / "metrics.jsonl", rows)
    episodes = [
        {"step": s, "group": 0, "guided": k < 2, "entry_id": entry, "success": ok, "actions": n}
        for s, rollouts in outcomes.items()
        for k, (ok, n, entry) in enumerate(rollouts)
    ]
    write_lines(d / "episodes.jsonl", episodes)


def test_guided_slots_are_paired_with_the_baselines_same_slot_while_both_actors_are_untrained(tmp_path):
    f, t = False, True
    grpo = {1: [(f, 8, None), (t, 5, None), (f, 8, None), (t, 4, None)], 2: [(t, 3, None)] * 4,
            3: [(t, 3, None)] * 4}  # fmt: skip
    comp = {
        1: [(f, 8, None), (f, 8, 7), (f, 8, None), (t, 4, None)],  # slot 0 replays, slot 1 lost by entry 7
        2: [(f, 8, 7), (t, 3, 7), (f, 8, None), (t, 3, None)],  # slot 2 does not replay
        3: [(f, 8, 7)] * 4,  # grpo trained at step 2: step 3 is not paired
    }
    _slot_run(tmp_path, "grpo", grpo, trained_at=2)
    _slot_run(tmp_path, "complementary", comp, trained_at=9)
    base, run = load_results(tmp_path)
    c = same_slot_pairs(run, base)
    assert (c["steps"], c["plain"], c["replayed"]) == (2, 5, 4)
    assert (c["pairs"], c["both"], c["baseline"], c["guided"]) == (3, 1, 2, 0)
    md = (build_report(tmp_path) / "report.md").read_text()
    assert "| complementary-s0 | grpo-s0 | 2 | 4 / 5 | 3 | 1 | 2 | 0 | 0.500 |" in md


def test_every_method_of_one_seed_draws_the_same_sample_seed_per_slot_and_the_log_records_it(tmp_path):
    base = get_preset("cpu").with_overrides(seed=3, tasks_per_step=2, k_rollouts=4)
    grpo, comp = (sample_tasks(base.with_overrides(method=m), 5) for m in ("grpo", "complementary"))
    assert [(s.seed, s.group, s.sample_seed) for s in grpo] == [
        (s.seed, s.group, s.sample_seed) for s in comp
    ]
    assert [s.guided for s in comp] == [True, True, False, False] * 2 and not any(s.guided for s in grpo)
    assert len({s.sample_seed for s in comp}) == 8
    episodes = [
        Episode(spec, "", "", None, [], [], 0.0, False, False, [0], 0.0) for spec in comp
    ]  # fmt: skip
    EpisodeLogReporter(tmp_path / "episodes.jsonl").on_episode_batch(5, episodes)
    lines = read_lines(tmp_path / "episodes.jsonl")
    assert [line["sample_seed"] for line in lines] == [s.sample_seed for s in comp]


def test_a_merge_pass_is_scored_by_its_inputs_before_and_its_outputs_after(tmp_path):
    write_fake_grid(tmp_path)
    run = [r for r in load_results(tmp_path) if r.slug == "complementary-s0"][0]
    (effect,) = merge_effects(run)
    assert (effect["step"], effect["inputs"], effect["outputs"]) == (2, 2, 1)
    assert effect["uses_before"] > 0 and effect["uses_after"] == 0  # entry 3 was never retrieved


def test_the_quality_rule_marks_grounded_entries_and_duplicates():
    assert entry_quality("Go southeast", "walk toward the staircase >", [])["good"]
    assert not entry_quality("The gold is yours", "{{lessonEnd}} .", [])["good"]
    first = entry_quality("Nothing happened.", "Nothing happened.", [])
    assert not first["action"] and not first["object"]
    seen = [{"go", "southeast", "walk", "toward", "the", "staircase", ">"}]
    assert entry_quality("Go southeast", "walk toward the staircase >", seen)["duplicate"]


def test_bank_quality_replays_the_banks_history_step_by_step(tmp_path):
    write_fake_grid(tmp_path)
    run = [r for r in load_results(tmp_path) if r.slug == "complementary-s0"][0]
    banks, _ = bank_replay(run).banks()
    q = {step: shares(bank) for step, bank in banks.items()}
    assert q[1]["entries"] == 2 and q[1]["good"] == pytest.approx(0.5)  # "Nothing happened." is not
    assert q[2]["entries"] == 2 and q[2]["good"] == pytest.approx(1.0)  # the merge removed it


def _change(cid: int, entry: int, kind: str, step: int, deleted: bool = False) -> dict:
    actor = "merge" if kind.startswith("merge") else "extractor"
    return {"id": cid, "entry": entry, "kind": kind, "actor": actor, "step": step, "title": f"t{entry}",
            "content": f"c{entry}", "deleted": deleted}  # fmt: skip


def test_a_late_merge_pass_is_replayed_where_it_was_applied_not_at_the_step_that_asked_for_it():
    """Step 2 asked for a pass that ran after step 3's entry was added and merged it away: its changes
    carry step 2 but come after step 3's. Replayed by id the bank ends as the run recorded it; sorted by
    step, entry 4's removal would come before its addition and the entry would live on."""
    changes = [
        _change(1, 1, "add", 1),
        _change(2, 2, "add", 1),
        _change(3, 3, "add", 2),
        _change(4, 4, "add", 3),  # step 3's distillation, before the late pass
        _change(5, 5, "merge_add", 2),
        _change(6, 3, "merge_remove", 2, deleted=True),
        _change(7, 4, "merge_remove", 2, deleted=True),
    ]
    replay = BankReplay.of(list(reversed(changes)), {1: 2, 2: 3, 3: 3})
    assert replay.mismatched == [] and replay.final_size == 3
    banks, final = replay.banks()
    assert sorted(banks[1]) == [1, 2] and sorted(banks[2]) == [1, 2, 3] and sorted(banks[3]) == [1, 2, 5]
    assert sorted(final) == [1, 2, 5]
    by_step = sorted(changes, key=lambda c: (c["step"], c["id"]))  # the old replay's order
    assert sizes_after(by_step)[-1] == 4
    assert BankReplay.of(changes, {1: 2, 2: 3, 3: 6}).mismatched == [3]  # a size the bank never had


def test_a_bank_that_never_reaches_the_recorded_size_is_flagged_in_the_report(tmp_path):
    write_fake_grid(tmp_path)
    metrics = tmp_path / "runs" / "complementary-s1" / "metrics.jsonl"
    write_lines(metrics, [r | {"bank/size": 7} if r.get("step") == 3 and r["kind"] == "step" else r
                          for r in read_lines(metrics)])  # fmt: skip
    md = (build_report(tmp_path) / "report.md").read_text()
    assert "**MISMATCH** complementary-s1" in md and "steps 3." in md
    assert "| complementary-s0 | 2 | 2 | 4 / 4 |" in md


def test_a_report_without_experience_still_has_every_section_saying_why_it_is_empty(tmp_path):
    write_fake_grid(tmp_path)
    for d in (tmp_path / "runs").glob("complementary-*"):
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    md = (build_report(tmp_path) / "report.md").read_text()
    for line in ("No run used experience.", "No guided episode was recorded.", "No merge pass ran.",
                 "No bank entry was written.", "No run used the extractor."):  # fmt: skip
        assert line in md, line


@pytest.mark.parametrize(
    ("theirs", "paired"),
    [
        ({"env": "Room", "seed": 5, "sample_seed": 11}, True),
        ({"env": "Room", "seed": 5, "sample_seed": 12}, False),
        ({"env": "Room", "seed": 5}, True),  # a log from before sample_seed was recorded
        ({"env": "Room", "seed": 6}, False),
        ({"env": "Other", "seed": 5, "sample_seed": 11}, False),
    ],
)
def test_a_slot_pairs_on_env_and_instance_and_on_the_sampling_seed_where_both_logs_record_it(theirs, paired):
    assert same_draw({"env": "Room", "seed": 5, "sample_seed": 11}, theirs) is paired


def test_the_rule_is_scored_against_hand_labels_and_a_label_whose_text_changed_is_stale():
    bank = {
        1: ("Go southeast", "walk toward the staircase >"),
        2: ("Door", "the door of the map"),
        3: ("x", "y"),
    }
    labels = [
        {"run": "c-s0", "entry": 1, "label": "useful", "title": "Go southeast", "content": bank[1][1]},
        {"run": "c-s0", "entry": 2, "label": "noise", "title": "Door", "content": bank[2][1]},
        {"run": "c-s0", "entry": 3, "label": "useful", "title": "x", "content": "y"},
        {"run": "c-s0", "entry": 4, "label": "noise", "title": "gone", "content": "merged away"},
    ]
    a = agreement(labels, {"c-s0": bank})
    assert (a.labelled, a.useful, a.marked, a.marked_useful) == (3, 2, 2, 1)
    assert (a.precision, a.recall, a.stale) == (0.5, 0.5, ["c-s0:4"])


def test_the_report_puts_the_labelled_share_beside_the_rules_precision(tmp_path):
    write_fake_grid(tmp_path)
    write_lines(
        tmp_path / "labels.jsonl",
        [{"run": "complementary-s0", "entry": 1, "label": "noise", "title": "Go southeast to >",
          "content": "move southeast toward the staircase", "reason": "test"}],
    )  # fmt: skip
    md = (build_report(tmp_path) / "report.md").read_text()
    assert "0 of 1 entries drawn from the final banks are useful" in md
    assert "the mechanical rule marks 1 good, 0 of them useful: precision 0.000, recall –" in md


def _final(arm: str, seed: int, without: float, with_exp: float | None = None) -> RunResult:
    row = {"eval/success": without} | ({} if with_exp is None else {"eval/with_exp/success": with_exp})
    method = "grpo" if arm == "grpo" else "static_online"
    return RunResult(f"{arm}-s{seed}", arm, seed, method, {}, {}, {0: row, 20: row}, [], [])


def test_the_preregistered_test_is_stated_whatever_its_result(tmp_path):
    from trainer.experiments.summary import PREREGISTRATION_FILE, preregistered_lines

    assert preregistered_lines(tmp_path, []) == []  # no pre-registration: no line
    test = {"arm": "oracle", "column": "with", "reference": "grpo", "reference_column": "without",
            "confidence": 0.95, "seeds": [0, 1, 2]}  # fmt: skip
    (tmp_path / PREREGISTRATION_FILE).write_text(json.dumps(test))
    grpo = [_final("grpo", s, v) for s, v in enumerate((0.2, 0.3, 0.25))]
    oracle = [_final("oracle", s, 0.1, v) for s, v in enumerate((0.8, 0.9, 0.85))]
    (line,) = preregistered_lines(tmp_path, grpo + oracle[:2])
    assert "not decided yet (seeds finished of 3: oracle 2, grpo 3)" in line
    (line,) = preregistered_lines(tmp_path, grpo + oracle)
    assert "oracle (with experience) − grpo (without experience)" in line
    assert "+0.600" in line and "supported: the interval lies above zero" in line
    close = [_final("oracle", s, 0.1, v) for s, v in enumerate((0.1, 0.5, 0.3))]
    assert "not supported: the interval reaches zero" in preregistered_lines(tmp_path, grpo + close)[0]
    worse = [_final("oracle", s, 0.9, v) for s, v in enumerate((0.0, 0.05, 0.02))]
    assert "contradicted: the interval lies below zero" in preregistered_lines(tmp_path, grpo + worse)[0]
