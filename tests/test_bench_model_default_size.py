"""`bench model --arch modernbert` without --size: each architecture's default size (BERT small,
ModernBERT tiny), where a single default of small failed for ModernBERT, which has no small."""

from __future__ import annotations

import argparse

import pytest

from bertgpu.bench import model as bench_model
from bertgpu.errors import BertgpuError


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_model.add_arguments(p)
    return p.parse_args(argv)


def _points(argv: list[str]) -> list[tuple[str, str]]:
    return [(p["arch"], p["size"]) for p in bench_model._grid(parse(argv), cuda=False)]


def test_each_architecture_has_its_own_default_size():
    """It was `error: --size small: modernbert comes in tiny, base`."""
    assert _points([]) == [("bert", "small")]
    assert _points(["--arch", "modernbert"]) == [("modernbert", "tiny")]
    assert _points(["--arch", "bert,modernbert"]) == [("bert", "small"), ("modernbert", "tiny")]
    assert _points(["--arch", "bert,modernbert", "--size", "tiny,base"]) == [
        ("bert", "tiny"), ("bert", "base"), ("modernbert", "tiny"), ("modernbert", "base")]
    with pytest.raises(BertgpuError, match="--size small: modernbert comes in tiny, base"):
        _points(["--arch", "modernbert", "--size", "small"])


def test_help_names_the_default_of_each_architecture():
    p = argparse.ArgumentParser()
    bench_model.add_arguments(p)
    text = " ".join(p.format_help().split())
    assert "default: small for bert, tiny for modernbert" in text
