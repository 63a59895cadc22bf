"""Generate ALFWorld games (``game.tw-pddl``) from what the ``alfworld`` package ships.

A game is one PDDL problem for the package's ALFRED domain (``data/alfred.pddl``) and text grammar
(``data/alfred.twl2``): the receptacles of one AI2-THOR floor plan at their interaction points
(``gen/layouts/FloorPlan*-openable.json``), objects of the types that floor plan holds
(``*-objects.json``) placed in receptacles that can hold them (``gen/constants.py``), and a goal of
one of the six ALFWorld task types with its text from ``gen/goal_library.py``.

Generation is a pure function of ``(floor_plan, task_type, gen_seed)``: no planner runs here.
``sources.py`` keeps a game only when the planner expert solves it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from trainer.envs.alfworld.engine import alfworld_package_dir, import_alfworld

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# The device each state-change task needs in the room, and the object property it needs.
_STATE_CHANGE = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}
_LAMPS = ("DeskLamp", "FloorLamp")
# Where a lamp stands: the receptacles it is "in" for the ALFRED domain's ToggleObject.
_LAMP_HOLDERS = {
    "DeskLamp": ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "TVStand"),
    "FloorLamp": ("SideTable", "ArmChair", "Sofa", "Dresser", "Bed", "Desk", "Shelf", "TVStand"),
}
# Eval plays the scenes ALFRED's generator holds out as test scenes (``constants.TEST_SCENE_NUMBERS``:
# floor plans 1-6 of each room type); train the other 24 of each. (ALFWorld's own valid_unseen
# split uses FloorPlan10, 219, 308 and 424, which are train plans here.)
EVAL_FLOOR_PLANS = tuple(n for base in (0, 200, 300, 400) for n in range(base + 1, base + 7))
TRAIN_FLOOR_PLANS = tuple(n for base in (0, 200, 300, 400) for n in range(base + 7, base + 31))
ROOM_TYPES = {0: "Kitchen", 200: "LivingRoom", 300: "Bedroom", 400: "Bathroom"}
MAX_INSTANCES = 2
"""Copies of each distractor object type (1..MAX); the target type gets 1..3 (2..3 for pick-two)."""
MAX_DISTRACTOR_TYPES = 8
"""Other object types placed besides the target: the planner's cost grows fast with the object count."""


@dataclass(frozen=True)
class Receptacle:
    id: str  # AI2-THOR id, e.g. "Cabinet|+00.68|+00.50|-02.20" or "Sink|-01.90|+00.97|-01.50|SinkBasin"
    type: str
    point: tuple[float, float, int, int]  # x, z, rotation, horizon of its interaction point


@dataclass(frozen=True)
class Task:
    task_type: str
    obj: str
    recep: str = ""
    toggle: str = ""

    def text(self, rng: random.Random) -> str:
        glib = _goal_library()
        template = rng.choice(glib[self.task_type]["templates"])
        return template.format(
            obj=self.obj.lower(), recep=self.recep.lower(), toggle=self.toggle.lower(), mrecep=""
        )


def room_type(floor_plan: int) -> str:
    return ROOM_TYPES[floor_plan // 100 * 100]


@cache
def _constants() -> Any:
    import_alfworld()
    import alfworld.gen.constants as constants  # alfworld: heavy, and imported only once ALFWORLD_DATA is set

    return constants


@cache
def _goal_library() -> dict[str, Any]:
    import_alfworld()
    import alfworld.gen.goal_library as glib  # alfworld: heavy, and imported only once ALFWORLD_DATA is set

    return glib.gdict


def _receptacle_type(thor_id: str) -> str | None:
    parts = thor_id.split("|")
    if len(parts) == 5:  # "Sink|x|y|z|SinkBasin": the basin of a sink or bathtub
        return parts[4] if parts[4] == parts[0] + "Basin" else None
    return parts[0]


@cache
def floor_plan(number: int) -> tuple[tuple[Receptacle, ...], frozenset[str], tuple[tuple[float, float], ...]]:
    """(receptacles, object types present, reachable floor points) of one floor plan."""
    layouts = alfworld_package_dir() / "gen" / "layouts"
    constants = _constants()
    points = json.loads((layouts / f"FloorPlan{number}-openable.json").read_text())
    receps = []
    for thor_id, (x, z, rot, hor) in sorted(points.items()):
        rtype = _receptacle_type(thor_id)
        if rtype in constants.VAL_RECEPTACLE_OBJECTS and rtype not in constants.MOVABLE_RECEPTACLES_SET:
            receps.append(Receptacle(thor_id, rtype, (float(x), float(z), int(rot), int(hor))))
    objects = frozenset(json.loads((layouts / f"FloorPlan{number}-objects.json").read_text()))
    floor = np.load(layouts / f"FloorPlan{number}-layout.npy")
    return tuple(receps), objects, tuple((float(x), float(z)) for x, z in floor)


@cache
def _pickupable() -> frozenset[str]:
    """Object types that some receptacle can hold (sliced variants and lamps excluded)."""
    values = _constants().VAL_RECEPTACLE_OBJECTS.values()
    return frozenset(o for held in values for o in held if not o.endswith("Sliced"))


def _can_hold(rtype: str, otype: str) -> bool:
    return otype in _constants().VAL_RECEPTACLE_OBJECTS.get(rtype, ())


def possible_tasks(number: int, task_type: str) -> list[Task]:
    """Every (object, receptacle, lamp) choice of ``task_type`` that floor plan ``number`` allows."""
    receps, objects, _ = floor_plan(number)
    constants = _constants()
    if room_type(number) not in constants.GOALS_VALID[task_type]:
        return []
    rtypes = sorted({r.type for r in receps})
    movable = sorted(o for o in objects & _pickupable() if any(_can_hold(r, o) for r in rtypes))
    if task_type == "look_at_obj_in_light":
        lamps = [lamp for lamp in _LAMPS if lamp in objects and set(_LAMP_HOLDERS[lamp]) & set(rtypes)]
        return [Task(task_type, obj, toggle=lamp) for lamp in lamps for obj in movable]
    if task_type in _STATE_CHANGE:
        device, prop = _STATE_CHANGE[task_type]
        if device not in rtypes:
            return []
        movable = [o for o in movable if o in constants.VAL_ACTION_OBJECTS[prop]]
    tasks = []
    for obj in movable:
        for recep in rtypes:
            # The target must be placeable and there must be somewhere else to start from.
            if (
                recep != obj
                and _can_hold(recep, obj)
                and any(_can_hold(r, obj) for r in rtypes if r != recep)
            ):
                if task_type in _STATE_CHANGE and recep == _STATE_CHANGE[task_type][0]:
                    continue
                tasks.append(Task(task_type, obj, recep=recep))
    return tasks


def mangle(name: str) -> str:
    """AI2-THOR id -> PDDL name, as ALFRED's ``fix_pddl_str_chars`` writes it."""
    for old, new in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        name = name.replace(old, new)
    return name


def _loc(x: float, z: float, rot: int, hor: int, tag: int) -> str:
    # A distinct location per receptacle (tag), so that "go to" always names exactly one receptacle.
    return mangle(f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{rot}|{hor}|{tag}")


Placement = tuple[str, str, Receptacle]
"""An object in the game: (AI2-THOR id, object type, the receptacle it starts in)."""


def generate_game(number: int, task_type: str, gen_seed: str) -> dict[str, Any] | None:
    """The ``game.tw-pddl`` data of one game, or None if the floor plan cannot host ``task_type``.

    ``solvable`` and ``walkthrough`` stay None until the planner has been asked (``sources.py``).
    """
    tasks = possible_tasks(number, task_type)
    if not tasks:
        return None
    rng = random.Random(f"{number}:{task_type}:{gen_seed}")
    task = rng.choice(tasks)
    receps, objects, floor = floor_plan(number)
    placed = _place_objects(rng, task, receps, objects)
    lamps = _place_lamps(rng, receps, objects)
    # -- locations: one per receptacle, plus the agent's start in the middle of the room
    loc_of = {r.id: _loc(*r.point, tag=i) for i, r in enumerate(receps)}
    sx, sz = rng.choice(floor)
    start = _loc(sx, sz, rng.choice((0, 90, 180, 270)), 30, tag=len(receps))
    problem = _pddl_problem(number, task, receps, placed + lamps, loc_of, start)
    return _game_data(number, task, gen_seed, problem, goal_text=task.text(rng))


def _place_objects(
    rng: random.Random, task: Task, receps: tuple[Receptacle, ...], objects: frozenset[str]
) -> list[Placement]:
    """Every movable type of the room (up to MAX_DISTRACTOR_TYPES besides the target), each in 1..MAX
    copies, the target type with enough copies for its task and never where it must end up."""
    rtypes = sorted({r.type for r in receps})
    movable = sorted(o for o in objects & _pickupable() if any(_can_hold(r, o) for r in rtypes))
    others = [o for o in movable if o != task.obj]
    movable = sorted([task.obj, *rng.sample(others, min(len(others), MAX_DISTRACTOR_TYPES))])
    placed: list[Placement] = []
    taken: set[str] = set()
    for otype in movable:
        holders = [r for r in receps if _can_hold(r.type, otype)]
        if otype == task.obj:
            # The target never starts where it must go (nor in the device that changes its state).
            device = _STATE_CHANGE.get(task.task_type)
            banned = {task.recep} | ({device[0]} if device else set())
            holders = [r for r in holders if r.type not in banned]
            low = 2 if task.task_type == "pick_two_obj_and_place" else 1
            count = rng.randint(low, 3)
        else:
            count = rng.randint(1, MAX_INSTANCES)
        for _ in range(count):
            placed.append(_place_one(rng, otype, holders, taken))
    return placed


def _place_one(rng: random.Random, otype: str, holders: list[Receptacle], taken: set[str]) -> Placement:
    """One object of ``otype`` in a random holder, at a jittered position no other object has."""
    recep = rng.choice(holders)
    while True:
        rx, ry, rz = (float(v) for v in recep.id.split("|")[1:4])
        x, z = rx + rng.uniform(-0.3, 0.3), rz + rng.uniform(-0.3, 0.3)
        thor_id = f"{otype}|{x:+06.2f}|{ry + 0.02:+06.2f}|{z:+06.2f}"
        if thor_id not in taken:
            break
    taken.add(thor_id)
    return thor_id, otype, recep


def _place_lamps(
    rng: random.Random, receps: tuple[Receptacle, ...], objects: frozenset[str]
) -> list[Placement]:
    """Each lamp type the room has, standing on one of the receptacles that can hold it."""
    lamps: list[Placement] = []
    for lamp in _LAMPS:
        holders = [r for r in receps if r.type in _LAMP_HOLDERS[lamp]]
        if lamp in objects and holders:
            recep = rng.choice(holders)
            rx, ry, rz = recep.id.split("|")[1:4]
            lamps.append((f"{lamp}|{rx}|{float(ry) + 0.5:+06.2f}|{rz}", lamp, recep))
    return lamps


def _pddl_problem(
    number: int,
    task: Task,
    receps: tuple[Receptacle, ...],
    placed: list[Placement],
    loc_of: dict[str, str],
    start: str,
) -> str:
    """The PDDL problem: its objects, the initial state and the goal of ``task``."""
    rtypes = sorted({r.type for r in receps})
    otypes = sorted({t for _, t, _ in placed})
    objs = [(mangle(i), t, r) for i, t, r in placed]
    decl = ["agent1 - agent"]
    decl += [f"{t}Type - otype" for t in otypes]
    decl += [f"{t}Type - rtype" for t in rtypes]
    decl += [f"{mangle(r.id)} - receptacle" for r in receps]
    decl += [f"{name} - object" for name, _, _ in objs]
    decl += [f"{loc} - location" for loc in [*loc_of.values(), start]]
    init = ["(= (totalCost) 0)", f"(atLocation agent1 {start})"]
    init += [f"(canContain {r}Type {o}Type)" for r in rtypes for o in otypes if _can_hold(r, o)]
    init += _receptacle_facts(receps, loc_of)
    init += _object_facts(objs, loc_of)
    goal = _goal_library()[task.task_type]["pddl"].format(
        obj=task.obj, recep=task.recep, toggle=task.toggle, mrecep=""
    )
    goal = goal.replace("#", "-")
    nl = "\n        "
    return (
        f"(define (problem plan_floorplan{number}_{task.task_type})\n"
        f"    (:domain alfred)\n"
        f"    (:objects\n        {nl.join(decl)}\n    )\n"
        f"    (:init\n        {nl.join(init)}\n    )\n"
        f"{goal.rstrip()}\n"
    )


def _receptacle_facts(receps: tuple[Receptacle, ...], loc_of: dict[str, str]) -> list[str]:
    facts = []
    for r in receps:
        facts.append(f"(receptacleType {mangle(r.id)} {r.type}Type)")
        facts.append(f"(receptacleAtLocation {mangle(r.id)} {loc_of[r.id]})")
        if r.type in _constants().OPENABLE_CLASS_SET:
            facts.append(f"(openable {mangle(r.id)})")
    return facts


def _object_facts(objs: list[Placement], loc_of: dict[str, str]) -> list[str]:
    """Type, place and affordances of each object (named in PDDL): lamps toggle, the rest are picked up."""
    actions = _constants().VAL_ACTION_OBJECTS
    facts = []
    for name, otype, r in objs:
        facts.append(f"(objectType {name} {otype}Type)")
        facts.append(f"(inReceptacle {name} {mangle(r.id)})")
        facts.append(f"(objectAtLocation {name} {loc_of[r.id]})")
        if otype in _LAMPS:
            facts.append(f"(toggleable {name})")
            continue
        facts.append(f"(pickupable {name})")
        for prop, pred in (("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable")):
            if otype in actions[prop]:
                facts.append(f"({pred} {name})")
    return facts


def _game_data(number: int, task: Task, gen_seed: str, problem: str, *, goal_text: str) -> dict[str, Any]:
    """The game file's content: the package's domain and grammar (with the goal text), the problem."""
    data_dir = alfworld_package_dir() / "data"
    grammar = (data_dir / "alfred.twl2").read_text().replace("UNKNOWN GOAL", goal_text)
    return {
        "pddl_domain": (data_dir / "alfred.pddl").read_text(),
        "grammar": grammar,
        "pddl_problem": problem,
        "solvable": None,
        "walkthrough": None,
        "meta": {
            "floor_plan": number,
            "task_type": task.task_type,
            "gen_seed": gen_seed,
            "goal": goal_text,
            "pddl_params": {
                "object_target": task.obj,
                "parent_target": task.recep,
                "toggle_target": task.toggle,
                "mrecep_target": "",
                "object_sliced": False,
            },
        },
    }


def write_game(path: Path, game: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(game))
    tmp.replace(path)
