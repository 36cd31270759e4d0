"""`python -m mlxd.worker --model-path DIR --model-id ID --socket PATH`."""

import sys

from .app import main
from .config import parse_args
from .lifeline import die_with_parent

if __name__ == "__main__":
    cfg = parse_args()
    if cfg.exit_with_parent:
        die_with_parent()
    sys.exit(main(cfg))
