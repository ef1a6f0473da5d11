"""The suite's own layout: every tier folder is one that pytest collects."""
import fnmatch
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "dist", "runs", "engines")


def test_every_tier_folder_is_collected(pytestconfig):
    # pytest's default norecursedirs holds "dist": the gloo-world tier was skipped without a word until it was set
    assert pytestconfig.getini("testpaths") == ["tests"]
    skipped = [(tier, pattern) for tier in TIERS for pattern in pytestconfig.getini("norecursedirs")
               if fnmatch.fnmatch(tier, pattern)]
    assert skipped == []
    assert sorted(p.name for p in TESTS.iterdir() if p.is_dir() and list(p.glob("test_*.py"))) == sorted(TIERS)
