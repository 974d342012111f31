"""``python -m eyas`` — the same CLI, for launchers such as ``torchrun -m eyas``."""

from eyas.cli import main

main()
