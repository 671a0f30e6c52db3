"""``python -m yolo_cl`` runs the ``yolo-cl`` command line."""
import sys

from .cli import main

sys.exit(main())
