"""Complementary RL: the training library. It never imports Django (see docs/design.md §2)."""
