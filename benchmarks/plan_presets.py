"""Each preset's peak per device as the launch plan gives it (trainer.plan): the preset table of
docs/launches.md. Nothing loads: the plan computes from the model shapes and the config.

    .venv/bin/python benchmarks/plan_presets.py

Writes ``docs/benchmarks/results/plan-presets.json`` (``benchmarks.outputs``) and refreshes its block; the
same figures as ``manage.py plan --config cpu --devices cpu:24GB`` (and ``--method grpo``), ``--config gpu-1
--devices 1x80GB`` and ``--config paper --devices 8x80GB --nproc 8``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # also runnable as a plain script
from benchmarks.outputs import write_output  # noqa: E402
from trainer.config import get_preset  # noqa: E402
from trainer.plan import GB, Devices, plan_run  # noqa: E402

PRESETS = {
    "cpu": ("cpu:24GB", ("complementary", "grpo"), "one CPU machine, 24 GB", "SmolLM2-135M, full fine-tunes"),
    "gpu-1": ("1x80GB", (None,), "one GPU, 80–141 GB", "Qwen2.5-7B-Instruct + Qwen3-4B, rank-16 LoRA on "
              "every linear layer over a frozen bf16 base, 8k context, lr 1e-5"),
    "paper": ("8x80GB", (None,), "8 × 80 GB, one node", "the same models, full fine-tunes, FSDP2 over "
              "`nproc = 8`, 8k context"),
}  # fmt: skip
"""Preset → (the devices it is planned for, the methods to plan (None: the preset's own), for, models)."""


def preset_figures(name: str) -> dict:
    devices, methods, what_for, models = PRESETS[name]
    devices = Devices.parse(devices)
    peaks, host = [], 0.0
    for method in methods:
        cfg = get_preset(name) if method is None else get_preset(name).with_overrides(method=method)
        plan = plan_run(cfg, devices)
        peaks.append((method, round(plan.device_bytes() / GB, 1)))
        host = max(host, plan.host_bytes() / plan.nproc / GB if devices.kind == "cuda" else 0.0)
    return {"preset": name, "for": what_for, "models": models, "devices": str(devices.describe()),
            "nproc": cfg.nproc, "peaks": peaks, "host_gb_per_rank": round(host, 1)}  # fmt: skip


def main() -> None:
    figures = {"presets": [preset_figures(name) for name in PRESETS]}
    for p in figures["presets"]:
        print(p["preset"], p["peaks"], f"host {p['host_gb_per_rank']} GB a rank" if p["nproc"] > 1 else "")
    write_output("plan-presets", figures)


if __name__ == "__main__":
    main()
