"""The REST API (``/api/v1/``, Django Ninja) and the personal access tokens that reach it."""
