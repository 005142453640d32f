"""`python -m launch`: validates, plans, runs and judges the recipes under recipes/."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
