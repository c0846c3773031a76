"""DVC stage `check_params`: see `python stages/check_params.py --help` and pipeline.cli."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable without installing the package

from pipeline.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["check_params", *sys.argv[1:]]))
