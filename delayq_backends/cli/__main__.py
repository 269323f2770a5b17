"""``python -m delayq_backends.cli``: the ``delayq`` command."""

from . import main

main()
