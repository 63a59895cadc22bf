"""Check MiniHack's text observation against NLE's own observation keys.

For random states of every MiniHack task (random level seeds; each move the expert's or a random
admissible one, so that states include carried keys, opened doors, monsters and teleports), the text
the agent is shown is parsed back and compared with what NLE reports for that state:

- the map is NLE's ``chars``, cropped to the box of cells drawn, row for row and column for column,
  with ``@`` at the agent's coordinates (``blstats`` x, y);
- each legend line ``- <description> (<symbol>): <direction> (<n> east, <m> south)`` names a cell whose
  ``screen_descriptions`` entry is the description and whose ``chars`` entry is the symbol, at that
  offset from the agent; the legend lists the nearest notable cells, none left out below its cap;
- "Next to you" gives ``screen_descriptions`` of the eight neighbours, and HP is ``blstats``'.

    python -m trainer.envs.minihack_check --states 1000     # every task, 1000 states each
"""

from __future__ import annotations

import argparse
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer.envs import make_env
from trainer.envs.minihack import _PLAIN, DIRECTIONS, LEGEND_CAP, TASKS, MiniHackEnv, _text

_LEGEND = re.compile(r"^- (?P<desc>.+) \((?P<symbol>.)\): (?P<where>.+)$")
_WHERE = re.compile(r"^(?P<compass>[a-z]+) \((?P<parts>[^)]*)\)$")
_PART = re.compile(r"^(?P<n>[1-9]\d*) (?P<axis>east|west|north|south)$")
_SIGN = {"east": (1, 0), "west": (-1, 0), "south": (0, 1), "north": (0, -1)}


@dataclass
class Report:
    name: str
    states: int = 0
    legend_lines: int = 0
    problems: list[str] = field(default_factory=list)


def _description(sd: np.ndarray, x: int, y: int) -> str:
    inside = 0 <= y < sd.shape[0] and 0 <= x < sd.shape[1]
    return _text(sd[y, x]) if inside else ""


def _offset(where: str) -> tuple[int, int] | None:
    """(dx, dy) that a legend's "southwest (1 west, 2 south)" says, or None if it does not parse or
    its compass word disagrees with its distances."""
    m = _WHERE.match(where)
    if m is None:
        return None
    dx = dy = 0
    for part in m.group("parts").split(", "):
        p = _PART.match(part)
        if p is None:
            return None
        sx, sy = _SIGN[p.group("axis")]
        dx, dy = dx + sx * int(p.group("n")), dy + sy * int(p.group("n"))
    if DIRECTIONS.get(m.group("compass")) != (int(np.sign(dx)), int(np.sign(dy))):
        return None
    return dx, dy


def _sections(text: str) -> dict[str, Any]:
    lines = text.split("\n")
    start = lines.index("Map (you are @; north is up):") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("You see"))
    return {
        "message": lines[start - 2].removeprefix("Message: "),
        "grid": lines[start:end],
        "legend": [ln for ln in lines[end + 1 :] if ln.startswith("- ")],
        "next_to": next(ln for ln in lines if ln.startswith("Next to you: ")),
        "hp": next(ln for ln in lines if ln.startswith("HP ")),
    }


def _notable(obs: dict[str, np.ndarray]) -> dict[tuple[int, int], str]:
    """Cells a legend should name: drawn, described, not the agent, not floor, corridor or wall."""
    ax, ay = (int(v) for v in obs["blstats"][:2])
    found = {}
    for y, x in zip(*np.nonzero((obs["chars"] != ord(" ")) & (obs["chars"] != 0)), strict=True):
        desc = _text(obs["screen_descriptions"][y, x])
        if (x, y) != (ax, ay) and desc and desc not in _PLAIN and "wall" not in desc:
            found[(int(x), int(y))] = desc
    return found


def check_observation(text: str, obs: dict[str, np.ndarray]) -> list[str]:
    """What ``text`` gets wrong about the NLE observation ``obs`` (empty when nothing)."""
    s = _sections(text)
    return _check_map(s["grid"], obs) + _check_legend(s["legend"], obs) + _check_status(s, obs)


def _check_map(grid: list[str], obs: dict[str, np.ndarray]) -> list[str]:
    chars = obs["chars"]
    ax, ay = (int(v) for v in obs["blstats"][:2])
    if chr(chars[ay, ax]) != "@":
        return [f"NLE's chars show {chr(chars[ay, ax])!r} at the agent's blstats ({ax}, {ay})"]
    ys, xs = np.nonzero((chars != ord(" ")) & (chars != 0))
    top, left = int(ys.min()), int(xs.min())
    crop = chars[top : int(ys.max()) + 1, left : int(xs.max()) + 1]
    want = [bytes(row).decode("latin-1").rstrip() for row in crop]
    if grid != want:
        return ["map differs from NLE's chars:\n" + "\n".join(grid) + "\n!=\n" + "\n".join(want)]
    if want[ay - top][ax - left] != "@":
        return ["map: the agent's cell is not @"]
    return []


def _check_legend(legend: list[str], obs: dict[str, np.ndarray]) -> list[str]:
    """Each line's description and symbol are NLE's at its offset from the agent; none left out."""
    chars, sd = obs["chars"], obs["screen_descriptions"]
    ax, ay = (int(v) for v in obs["blstats"][:2])
    problems = []
    for line in legend:
        m = _LEGEND.match(line)
        offset = _offset(m.group("where")) if m else None
        if offset is None:
            problems.append(f"legend line does not parse: {line!r}")
            continue
        x, y = ax + offset[0], ay + offset[1]
        if not (0 <= y < chars.shape[0] and 0 <= x < chars.shape[1]):
            problems.append(f"legend points off the map: {line!r}")
            continue
        nle_says = (_text(sd[y, x]), chr(chars[y, x]))
        if nle_says != (m.group("desc"), m.group("symbol")):
            problems.append(f"legend {line!r}: NLE has {nle_says[0]!r} ({nle_says[1]}) at ({x}, {y})")
    notable = _notable(obs)
    if len(legend) != min(len(notable), LEGEND_CAP):
        problems.append(f"legend has {len(legend)} lines for {len(notable)} notable cells")
    return problems


def _check_status(s: dict[str, Any], obs: dict[str, np.ndarray]) -> list[str]:
    """Neighbours from ``screen_descriptions``, HP from ``blstats``, the message from ``message``."""
    sd, bl = obs["screen_descriptions"], obs["blstats"]
    ax, ay = int(bl[0]), int(bl[1])
    around = [
        f"{name} {_description(sd, ax + dx, ay + dy) or 'solid stone or unexplored'}"
        for name, (dx, dy) in DIRECTIONS.items()
    ]
    problems = []
    if s["next_to"] != "Next to you: " + "; ".join(around) + ".":
        problems.append(f"{s['next_to']!r} != NLE's neighbours {around}")
    if s["hp"] != f"HP {int(bl[10])}/{int(bl[11])}.":
        problems.append(f"{s['hp']!r} but blstats say HP {int(bl[10])}/{int(bl[11])}")
    if s["message"] != (_text(obs["message"]) or "(none)"):
        problems.append(f"message {s['message']!r} != NLE's {_text(obs['message'])!r}")
    return problems


def _visible_text(obs_text: str) -> str:
    """The render inside an observation (without the reset's goal line)."""
    return obs_text.split("\n", 1)[1] if obs_text.startswith("Goal: ") else obs_text


def check_env(name: str, states: int, seed: int = 0, expert_share: float = 0.5) -> Report:
    """Check ``states`` states of one task (random train levels, a mix of expert and random moves)."""
    env: MiniHackEnv = make_env(name, "train")  # type: ignore[assignment]
    rng = random.Random(f"{name}:{seed}")
    report = Report(name)
    try:
        while report.states < states:
            text, _ = env.reset(rng.randrange(10**9))
            while True:
                problems = check_observation(_visible_text(text), env._obs)
                report.states += 1
                report.legend_lines += sum(ln.startswith("- ") for ln in text.split("\n"))
                where = f"{name} level {env._level_seed} turn {env.turn}"
                report.problems += [f"{where}: {p}" for p in problems]
                if report.states >= states:
                    break
                moves = env.admissible_actions()
                action = env.expert_action() if rng.random() < expert_share else rng.choice(moves)
                text, _, done, _ = env.step(action)
                if done:
                    break
    finally:
        env.close()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.envs.minihack_check",
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--states", type=int, default=1000, help="states checked per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task", action="append", help="only this task (repeatable); default: all")
    args = parser.parse_args()
    total = bad = 0
    for name in args.task or [t.name for t in TASKS]:
        start = time.perf_counter()
        report = check_env(name, args.states, args.seed)
        total += report.states
        bad += len(report.problems)
        print(
            f"{name}: {report.states} states, {report.legend_lines} legend lines, "
            f"{len(report.problems)} problems ({time.perf_counter() - start:.1f} s)"
        )
        for problem in report.problems[:5]:
            print("   ", problem)
    print(f"all: {total} states, {bad} problems")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
