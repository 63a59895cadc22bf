"""Complementary RL: the training library. It never imports Django (see DESIGN.md §2)."""
