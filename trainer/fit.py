"""Whether a launch fits a worker, and what to change when it does not: the refusal the launch form, the API,
``manage.py train`` and ``manage.py plan`` give (the plan itself is ``trainer.plan``), and the plan's command
line (``python -m trainer.fit``; ``manage.py plan``).

A refusal gives the plan's numbers and its fixes: the settings that, each lowered to the value named (the
largest found that fits), make the launch fit; one process instead of several on a CPU machine; several
settings together when no single one is enough; then a preset that fits and how many GPUs would.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import IO

from trainer.config import PRESETS, ConfigError, RunConfig
from trainer.plan import GB, MAX_PHASE_HOURS, Devices, PlanError, gb_text, plan_run

# ---- refusal --------------------------------------------------------------------------------------


def refusal(cfg: RunConfig, devices: Devices, nproc: int | None = None) -> str | None:
    """None when ``cfg`` fits ``devices`` on ``nproc`` (default: ``cfg.nproc``) of them; otherwise why not,
    with the plan's numbers and its fixes: the settings that, each lowered to the value named, make it fit
    (``setting_fixes``), a preset that fits here, and how many GPUs with FSDP would. What the launch form
    and the API call before accepting a run."""
    plan = plan_run(cfg, devices, nproc=nproc)
    why = plan.shortfall(devices)
    if why is None:
        return None
    fixes = [_lower(fix) for fix in setting_fixes(cfg, devices, plan.nproc)[:2]]
    if plan.blockers:
        return "; or ".join([why, *fixes])
    largest = max(plan.parts, key=lambda p: p.bytes)
    presets = [f"{name!r}" for name in _presets_that_fit(devices)]
    fixes += [f"use preset {' or '.join(presets)}"] if presets else []
    gpus = _gpus_that_fit(cfg)
    if gpus:
        how = "1 GPU of 80 GB" if gpus == 1 else f"{gpus} × 80 GB GPUs with FSDP"
        fixes.append(f"{how} (--devices {gpus}x80GB --nproc {gpus})")
    fix = ", or ".join(fixes) or "shrink the largest part"
    return f"{why}; the largest part is {largest.name} ({gb_text(largest.bytes)}); {fix}"


def _lower(fix: dict[str, float]) -> str:
    return "lower " + " and ".join(f"{key} to {value:g}" for key, value in fix.items())


SHRINKABLE = (
    "nproc",
    "rollout.kv_cache_gib",
    "extractor.kv_cache_gib",
    "rollout.context_tokens",
    "rollout.max_new_tokens",
    "actor.micro_batch_size",
    "extractor.micro_batch_size",
    "tasks_per_step",
    "eval_episodes",
    "rollout.turn_limit",
    "extractor.trajectory_chars",
)
"""Settings whose smaller values need less memory or time: where a refusal looks for its fix."""


def setting_fixes(cfg: RunConfig, devices: Devices, nproc: int) -> list[dict[str, float]]:
    """Changes that make ``cfg`` fit ``devices``, the least first: one setting lowered to the value given
    (the largest found that fits); where none does on a CPU machine shared by ``nproc`` processes, one
    process with one setting lowered."""
    fixes = _single_fixes(cfg, devices)
    if fixes:
        return fixes
    if devices.kind == "cpu" and nproc > 1:
        whole = Devices("cpu", devices.memory * devices.count)
        alone = cfg.with_overrides(nproc=1)
        fixes = [{"nproc": 1} | fix for fix in _single_fixes(alone, whole)]
        return fixes or [{"nproc": 1} | fix for fix in _combined_fix(alone, whole)]
    return _combined_fix(cfg, devices)


def _combined_fix(cfg: RunConfig, devices: Devices) -> list[dict[str, float]]:
    """Several settings lowered together (none alone is enough): halve, one at a time, the setting whose
    halving helps most until the plan fits, then raise each back as far as it still fits."""
    changes: dict[str, float] = {}
    for _ in range(60):
        if _fits_with(cfg, changes, devices):
            break
        tried = [
            (_excess(cfg, changes | {key: half}, devices), key, half) for key, half in _halvings(cfg, changes)
        ]
        tried = [t for t in tried if t[0] is not None]
        if not tried:
            return []
        _, key, half = min(tried)
        changes[key] = half
    else:
        return []
    for key in list(changes):  # raise each back: the largest value that fits with the others
        others = {k: v for k, v in changes.items() if k != key}
        changes[key] = _largest_that_fits(cfg, key, _setting(cfg, key), devices, changes[key], others)
    return [changes]


def _halvings(cfg: RunConfig, changes: dict[str, float]) -> list[tuple[str, float]]:
    out = []
    for key in SHRINKABLE[1:]:  # not nproc
        now = changes.get(key, _setting(cfg, key))
        half = now // 2 if isinstance(now, int) else now / 2 if now else None
        if half:
            out.append((key, half))
    return out


def _excess(cfg: RunConfig, changes: dict[str, float], devices: Devices) -> float | None:
    """How far the changed config is from fitting (its memory or its slowest phase over the limit, the
    larger ratio); None when the change is not a valid config."""
    try:
        plan = plan_run(cfg.with_overrides(**changes), devices)
    except ConfigError:
        return None
    return max(plan.device_bytes() / devices.memory, max(plan.step_s, plan.eval_s) / (MAX_PHASE_HOURS * 3600))


def _single_fixes(cfg: RunConfig, devices: Devices) -> list[dict[str, float]]:
    found = []
    for key in SHRINKABLE:
        now = _setting(cfg, key)
        if not now or (key == "nproc" and (devices.kind != "cpu" or now < 2)):
            continue
        value = _largest_that_fits(cfg, key, now, devices)
        if value is not None:
            found.append((value / now, {key: value}))
    return [fix for _, fix in sorted(found, key=lambda f: -f[0])]


def _setting(cfg: RunConfig, key: str) -> float | None:
    node: object = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node  # type: ignore[return-value]


def _fits_with(cfg: RunConfig, changes: dict[str, float], devices: Devices) -> bool:
    try:
        changed = cfg.with_overrides(**changes)
        if "nproc" in changes:  # processes on one CPU machine share its memory
            devices = Devices("cpu", devices.memory * devices.count).shared_by(changed.nproc)
        return plan_run(changed, devices, nproc=changed.nproc).fits(devices)
    except ConfigError:  # PlanError too
        return False


def _largest_that_fits(
    cfg: RunConfig,
    key: str,
    now: float,
    devices: Devices,
    low: float | None = None,
    others: dict | None = None,
) -> float | None:
    """The largest value of ``key`` below ``now`` that fits (whole numbers for whole-number settings; two
    significant digits otherwise), or None when no halving of it does. ``low``: a value known to fit;
    ``others``: settings changed with it."""
    others = others or {}
    whole, high = isinstance(now, int), now
    if low is None:
        low = now // 2 if whole else now / 2
        while not _fits_with(
            cfg, others | {key: low}, devices
        ):  # halve until one fits (not monotone: too small a
            high, low = low, (low // 2 if whole else low / 2)  # cache or context does not fit either)
            if low < (1 if whole else now / 2**20):
                return None
    for _ in range(40):  # bisect: low fits, high does not
        mid = (low + high) // 2 if whole else math.sqrt(low * high)
        if mid in (low, high) or (not whole and high / low < 1.01):
            break
        low, high = (mid, high) if _fits_with(cfg, others | {key: mid}, devices) else (low, mid)
    if whole:
        return int(low)
    scale = 10 ** (1 - math.floor(math.log10(low)))  # two significant digits, rounded down
    return math.floor(low * scale) / scale


def _presets_that_fit(devices: Devices) -> list[str]:
    return [name for name, preset in PRESETS.items() if plan_run(preset, devices).fits(devices)]


def _gpus_that_fit(cfg: RunConfig) -> int | None:
    for n in (1, 2, 4, 8, 16, 32, 64):
        node = Devices("cuda", 80 * GB, n)
        try:
            if plan_run(cfg, node, nproc=n).fits(node):
                return n
        except PlanError:
            return None
    return None


# ---- command line (python -m trainer.fit; manage.py plan) ------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``manage.py train``'s config flags (``--config``, ``--set`` ...) plus the devices to plan for."""
    # imported here: trainer.train loads the training stack (~1 s); the web server plans without it
    from trainer.train import add_arguments as add_train_arguments

    add_train_arguments(parser)
    parser.add_argument("--preset", help="a preset to start from (the same as --config NAME)")
    parser.add_argument("--devices", help="8x80GB (GPUs), cpu:24GB, or cpu (this machine) [cpu]")
    try:  # manage.py train's own --nproc sets the config's nproc; older parsers lack it
        parser.add_argument("--nproc", type=int, help="processes, one per device, FSDP2 over them [1]")
    except argparse.ArgumentError:
        pass


def plan_from_args(args: argparse.Namespace, stdout: IO[str]) -> str | None:
    """Print the plan of the config the flags describe; return the refusal (None when it fits)."""
    from trainer.train import config_from_args  # imported here: see add_arguments

    args.config = args.config or args.preset
    cfg = config_from_args(args)
    if getattr(args, "nproc", None) and cfg.nproc != args.nproc:
        cfg = cfg.with_overrides(nproc=args.nproc)
    devices = Devices.parse(args.devices) if args.devices else Devices.this_machine()
    if cfg.nproc <= (os.cpu_count() or 1):  # a CPU machine runs one process a core (webapp.workers)
        devices = devices.shared_by(cfg.nproc)
    print(plan_run(cfg, devices).table(), file=stdout)
    print(f"devices: {devices.describe()} ({devices.kind})", file=stdout)
    return refusal(cfg, devices)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.fit", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        refused = plan_from_args(args, sys.stdout)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if refused:
        print(f"refused: {refused}", file=sys.stderr)
        return 1
    print("fits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
