"""``reach embed-server``: the bundled embedding model as a small HTTP service of its own."""
