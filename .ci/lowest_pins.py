"""Prints pip constraints that pin each core dependency of pyproject.toml to its lower bound (`name>=X` -> `name==X`).

`make test-lowest` installs with them, so the suite runs on the oldest versions the package claims to support.
"""

import re
import sys
import tomllib
from pathlib import Path

pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
for requirement in pyproject["project"]["dependencies"]:
    spec, _, marker = requirement.partition(";")
    match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*>=\s*([^,\s]+).*", spec)
    if match is None:
        sys.exit(f"lowest_pins.py: {requirement!r} has no lower bound (name>=version); give it one in pyproject.toml")
    print(f"{match[1]}=={match[2]}" + (f"; {marker.strip()}" if marker else ""))
