"""The short-conv benchmark's arguments: its defaults parse (session 15's GPU call once failed
on a stale default variant) and name only known variants; an unknown one is refused by name."""

from __future__ import annotations

import pytest

from experiments.benchmarks import short_conv


def test_defaults_parse_and_name_known_variants():
    args = short_conv.parse_args([])
    assert set(args.variants) <= set(short_conv.VARIANTS)
    named = short_conv.parse_args(["--variants", ",".join(short_conv.VARIANTS)])
    assert named.variants == [v for v in short_conv.VARIANTS if v != "default"]


def test_an_unknown_variant_is_refused(capsys):
    with pytest.raises(SystemExit):
        short_conv.parse_args(["--variants", "stream"])
    assert "'stream' is not one of default, c256, u2, s32" in capsys.readouterr().err
