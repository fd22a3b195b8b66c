"""``python -m reachmesh`` is the ``reach`` command."""

from reachmesh.cli import main

main()
