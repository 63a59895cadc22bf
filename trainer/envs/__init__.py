"""Text environments behind one protocol (see ``base.py``). Importing this package registers them."""

from trainer.envs import alfworld, minihack, minihack_pool, sokoban, swe, webshop  # noqa: F401,E402  (register)
from trainer.envs.base import (  # noqa: F401
    MIXTURES,
    StepInfo,
    TaskMixture,
    TextEnv,
    env_names,
    make_env,
    make_mixture,
    register_env,
)
