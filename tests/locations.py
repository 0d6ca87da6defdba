"""Where the tests find the repository and the shared data, wherever a test file sits."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root."""

SHARED_DATA = ROOT.parent / "shared" / "data"
"""``../shared/data`` beside the checkout (public networks and image sets; may be absent)."""

SHARED_BN = SHARED_DATA / "bn"
"""The public Bayesian networks in ``../shared/data/bn``."""
