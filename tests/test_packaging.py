"""Our import packages must be the only ones of their name in the environment.

`daemon`, `drivers`, `sim_bridge` and `calibration` are generic names: python-daemon, for one,
ships a top-level `daemon`. If any installed distribution also provides one of them, imports
would resolve to whichever comes first on sys.path.
"""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

import pytest

OUR_PACKAGES = ("daemon", "drivers", "sim_bridge", "calibration")
REPO = Path(__file__).resolve().parents[1]


def _top_level_names(dist: md.Distribution) -> set[str]:
    names: set[str] = set()
    top = dist.read_text("top_level.txt")
    if top:
        names.update(line.strip() for line in top.splitlines() if line.strip())
    for f in dist.files or ():
        parts = Path(str(f)).parts
        if not parts or parts[0].endswith((".dist-info", ".egg-info", ".data")) or parts[0] in ("..", "__pycache__"):
            continue
        first = parts[0]
        if len(parts) == 1:
            if first.endswith(".py"):
                names.add(first[:-3])
        else:
            names.add(first)
    return names


@pytest.mark.parametrize("package", OUR_PACKAGES)
def test_no_other_distribution_provides_our_top_level_package(package: str) -> None:
    clashes = []
    for dist in md.distributions():
        if dist.metadata["Name"] and dist.metadata["Name"].lower() == "so101d":
            continue
        if package in _top_level_names(dist):
            clashes.append(dist.metadata["Name"])
    assert not clashes, f"distribution(s) {clashes} also provide a top-level '{package}' module"


@pytest.mark.parametrize("package", OUR_PACKAGES)
def test_our_package_resolves_to_this_repository(package: str) -> None:
    mod = __import__(package)
    assert Path(mod.__file__).resolve().parent == REPO / package


def test_the_unrelated_leisaac_package_is_not_installed() -> None:
    # PyPI's `leisaac` is an unrelated project; LeIsaac installs from source on a GPU machine only.
    with pytest.raises(md.PackageNotFoundError):
        md.distribution("leisaac")
