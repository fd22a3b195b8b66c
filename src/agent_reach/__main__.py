"""``python -m agent_reach`` is the ``reach`` command."""

from agent_reach.cli import main

main()
