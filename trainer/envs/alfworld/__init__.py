"""ALFWorld on its real engine, with games generated from the floor plans the package ships.

Importing this package registers the ``ALFWorld`` env; ``alfworld`` itself is imported only when
an engine starts. ``python -m trainer.envs.alfworld --help`` generates games and measures costs.
"""

from trainer.envs.alfworld.env import ALFWorldEnv, match_command

__all__ = ["ALFWorldEnv", "match_command"]
