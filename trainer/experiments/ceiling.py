"""The ceiling of a room pool before any training: what an entry is worth to an agent that follows it.

    python -m trainer.experiments.ceiling [--actor] [--out FILE]

Three agents play every room of the pool (``trainer.envs.minihack_pool``), each without and with the room's
oracle entry:

- a scripted explorer, which sees only what the player sees: it walks to the stairs once they are in view,
  else to the nearest seen square that borders unseen ones;
- the same explorer handed the entry: it first plays the moves the entry names, then explores;
- with ``--actor``, the untrained actor, greedy, the entry injected into its system prompt exactly as the
  "with experience" evaluation does.

Every agent stops at the turn limit of ``--config`` (the grid's base config), as a rollout does.

The figures go to ``--out`` as JSON with the command, commit, CPU and threads that produced them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainer.config import RunConfig
from trainer.envs.base import make_env
from trainer.envs.minihack import DIRECTIONS, MiniHackEnv, _passable
from trainer.envs.minihack_pool import POOL_ENV, load_pool, oracle_entries
from trainer.experiments.provenance import provenance

_WAY = re.compile(r"From the start, move (.+?) \(\d+ moves? in all\)")
_RUN = re.compile(r"^(\w+)(?: (\d+) times)?$")


def parse_way(content: str) -> list[str]:
    """The moves an oracle entry names: 'move east, then southeast 2 times (3 moves in all)' → [east,
    southeast, southeast]; [] when the text names none."""
    found = _WAY.search(content)
    if found is None:
        return []
    moves: list[str] = []
    for part in found.group(1).split(", then "):
        run = _RUN.match(part.strip())
        if run is None or run.group(1) not in DIRECTIONS:
            return []
        moves += [run.group(1)] * int(run.group(2) or 1)
    return moves


def explore_action(env: MiniHackEnv, blocked: set[tuple[int, int]]) -> str:
    """The explorer's next move from what the player has seen (``chars``), nothing privileged. ``blocked``
    (the explorer's memory, updated here): squares seen from next to them that showed nothing, walls or
    stone, which a dark room does not draw."""
    chars = env._obs["chars"]
    start = env._agent()
    seen = {(int(x), int(y)) for y, x in zip(*np.nonzero(chars != ord(" ")), strict=True)}
    blocked |= {(start[0] + dx, start[1] + dy) for dx, dy in DIRECTIONS.values()} - seen
    walkable = {p for p in seen if p == start or _passable(env._desc(*p))}
    stairs = {p for p in seen if chars[p[1], p[0]] == ord(">")}

    def borders_unknown(p: tuple[int, int]) -> bool:
        return any((p[0] + dx, p[1] + dy) not in seen | blocked for dx, dy in DIRECTIONS.values())

    goals = stairs or {p for p in walkable if p != start and borders_unknown(p)}
    first: dict[tuple[int, int], str] = {start: ""}
    queue = deque([start])
    while queue:
        p = queue.popleft()
        if p in goals:
            return first[p]
        for name, (dx, dy) in DIRECTIONS.items():
            q = (p[0] + dx, p[1] + dy)
            if q in walkable and q not in first:
                first[q] = first[p] or name
                queue.append(q)
    return (env.admissible_actions() or list(DIRECTIONS))[0]


def play_scripted(
    env: MiniHackEnv, index: int, moves: Sequence[str] = (), turn_limit: int | None = None
) -> dict[str, Any]:
    """One episode of room ``index``: the given moves first, then the explorer; at most ``turn_limit``
    actions (the env's own limit when None), as the rollout's turn limit cuts an actor's episode."""
    env.reset(index)
    info: dict[str, Any] = {}
    actions = 0
    planned, blocked = list(moves), set()
    while not env.done and actions < (turn_limit or env.max_turns):
        _, _, _, info = env.step(planned.pop(0) if planned else explore_action(env, blocked))
        actions += 1
    return {"success": bool(info.get("success")), "actions": actions}


def scripted_rows(env_name: str = POOL_ENV, turn_limit: int | None = None) -> list[dict[str, Any]]:
    """Per room: the explorer without and with the room's oracle entry."""
    entries = oracle_entries(env_name)
    env = make_env(env_name, split="eval")
    try:
        rows = []
        for index, (room, entry) in enumerate(zip(load_pool(env_name), entries, strict=True)):
            rows.append(
                {
                    "room": room.name,
                    "without": play_scripted(env, index, turn_limit=turn_limit),
                    "with": play_scripted(env, index, parse_way(entry["content"]), turn_limit),
                }
            )
        return rows
    finally:
        env.close()


def totals(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> dict[str, dict[str, float]]:
    """Success rate and mean actions of each column over the rooms."""
    n = max(len(rows), 1)
    return {
        c: {
            "success": sum(r[c]["success"] for r in rows) / n,
            "actions": sum(r[c]["actions"] for r in rows) / n,
        }
        for c in columns
    }


def actor_rows(config: Path, env_name: str = POOL_ENV) -> list[dict[str, Any]]:
    """Per room: the config's (untrained) actor, greedy, without and with the room's oracle entry."""
    from trainer.evaluate import EVAL_TEMPERATURE, eval_runner, eval_specs
    from trainer.rollout.base import engine_from_config
    from trainer.rollout.runner import Experience

    cfg = RunConfig.from_file(config)
    actor = Path(cfg.actor.model_path)
    engine = engine_from_config(actor, cfg.rollout, seed=cfg.seed)
    runner = eval_runner(engine, actor, cfg.rollout, cfg.experience.placement)
    entries = [f"{e['title']}\n{e['content']}" for e in oracle_entries(env_name)]
    rooms = load_pool(env_name)

    def play(retrieve: Callable[..., list[Experience]] | None) -> list:
        specs = eval_specs(env_name, len(rooms), guided=retrieve is not None)
        return runner.run(specs, retrieve=retrieve, temperature=EVAL_TEMPERATURE)[0]

    def oracle(queries: Sequence[Any]) -> list[Experience]:
        return [Experience(entries[_room_of(q.goal, rooms)]) for q in queries]

    try:
        without, with_entry = play(None), play(oracle)
    finally:
        runner.close()
        engine.close()
    return [
        {
            "room": room.name,
            "without": {"success": a.success, "actions": a.num_actions},
            "with": {"success": b.success, "actions": b.num_actions},
            "same_actions": [t.action for t in a.turns] == [t.action for t in b.turns],
            "actions_without": [t.action for t in a.turns],
            "actions_with": [t.action for t in b.turns],
        }
        for room, a, b in zip(rooms, without, with_entry, strict=True)
    ]


PROBE_COLUMNS = ("without", "system", "turn")
"""The first-move probe's prompts: no entry, the entry in the system prompt, or after the observation."""


def first_move_probe(
    model_path: Path, env_name: str = POOL_ENV, entries: Sequence[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Does the actor read the entry? Per room, the probability the actor gives the entry's first move among
    the eight directions at the first turn (each direction's answer scored whole, after the answer opener),
    without the room's entry and with it in either place (``experience.placement``): a greedy sequence that
    does not change can still hide a shift that sampling, and so GRPO, would see."""
    import torch

    from trainer.models import load_causal_lm, load_tokenizer
    from trainer.prompts import ChatBuilder, answer_prefix, system_prompt, user_message

    model = load_causal_lm(model_path).eval()
    chat = ChatBuilder(load_tokenizer(model_path))
    env = make_env(env_name, split="eval")
    entries = entries if entries is not None else oracle_entries(env_name)
    answers = [chat.encode_text(" " + d) for d in DIRECTIONS]

    def p_move(prompt: list[int], move: str) -> float:
        scores = []
        for answer in answers:
            ids = torch.tensor([prompt + answer])
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), -1)
            scores.append(float(logp.gather(1, ids[0, len(prompt) :, None]).sum()))
        return float(torch.softmax(torch.tensor(scores), 0)[list(DIRECTIONS).index(move)])

    rows = []
    try:
        for index, (room, entry) in enumerate(zip(load_pool(env_name), entries, strict=True)):
            obs, _ = env.reset(index)
            move = parse_way(entry["content"])[0]
            text = f"{entry['title']}\n{entry['content']}"
            prompts = {
                "without": (system_prompt(env), user_message(obs, env)),
                "system": (system_prompt(env, text), user_message(obs, env)),
                "turn": (system_prompt(env), user_message(obs, env, text)),
            }
            row: dict[str, Any] = {"room": room.name, "first_move": move}
            for column, (system, user) in prompts.items():
                row[f"p_{column}"] = p_move(chat.prompt(system, user, answer_prefix(env)), move)
            rows.append(row)
    finally:
        env.close()
    return rows


def _room_of(goal: str, rooms: Sequence[Any]) -> int:
    return next(i for i, r in enumerate(rooms) if f"the {r.name} room" in goal)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default=POOL_ENV)
    parser.add_argument("--actor", action="store_true", help="also play the untrained actor (minutes)")
    parser.add_argument("--config", type=Path, default=Path("configs/cpu-dark-pool-grpo-lora.toml"))
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    cfg = RunConfig.from_file(args.config)
    turn_limit = cfg.rollout.turn_limit
    out: dict[str, Any] = {"env": args.env, "rooms": len(load_pool(args.env)), "turn_limit": turn_limit}
    out["placement"] = cfg.experience.placement
    out["scripted"] = scripted_rows(args.env, turn_limit)
    out["scripted_totals"] = totals(out["scripted"], ("without", "with"))
    if args.actor:
        out["actor"] = actor_rows(args.config, args.env)
        out["actor_totals"] = totals(out["actor"], ("without", "with"))
        out["actor_same_actions"] = sum(r["same_actions"] for r in out["actor"])
        out["first_move"] = first_move_probe(Path(cfg.actor.model_path), args.env)
        n = len(out["first_move"])
        out["first_move_mean"] = {c: sum(r[f"p_{c}"] for r in out["first_move"]) / n for c in PROBE_COLUMNS}
    out["provenance"] = provenance(["python", "-m", "trainer.experiments.ceiling", *(argv or sys.argv[1:])])
    text = json.dumps(out, indent=1) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(
        json.dumps(
            {k: v for k, v in out.items() if k.endswith(("totals", "_mean")) or k == "actor_same_actions"}
        )
    )


if __name__ == "__main__":
    main()
