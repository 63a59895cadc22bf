"""SWE-mini: SWE-bench-shaped bug-fixing tasks over real pure-Python projects (see ``env.py``)."""

from trainer.envs.swe.env import SWEMiniEnv  # noqa: F401  (registers "SWE-mini")
