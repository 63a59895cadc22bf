"""WebShop-synth: WebShop's text shopping environment over a generated catalogue (or real WebShop data).

Importing registers ``WebShop-synth`` and ``WebShop`` (real data from ``$WEBSHOP_DATA``). The catalogue
and its BM25 index are built on first use, not at import.
"""

from trainer.envs.webshop.env import WebShopEnv, random_valid_action

__all__ = ["WebShopEnv", "random_valid_action"]
