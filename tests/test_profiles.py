"""Run profiles (``autocompress.profiles``): one name sizes every stage."""

from __future__ import annotations

import pytest


def test_the_tiny_profile_shrinks_every_stage_and_explicit_options_win():
    from autocompress.errors import AutoCompressError
    from autocompress.profiles import TINY, get_profile, with_profile
    from autocompress.stage_config import STAGE_CONFIGS, check_options

    assert set(TINY.options) == set(STAGE_CONFIGS)  # every stage that takes options
    assert check_options(with_profile(None, TINY)) == TINY.options
    merged = with_profile({"distill": {"tokens": 9_000}, "search": {"dnas": {"steps": 2}}},
                          TINY)
    assert merged["distill"] == {**TINY.options["distill"], "tokens": 9_000}
    assert merged["search"]["dnas"] == {**TINY.options["search"]["dnas"], "steps": 2}
    assert get_profile(None).options == {} and get_profile("full").eval_limit is None
    with pytest.raises(AutoCompressError, match="unknown profile 'huge'.*tiny"):
        get_profile("huge")
