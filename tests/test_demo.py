"""The demo's pipeline end to end on the real Wikipedia sample, cut to a few steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertgpu.cli import main

pytest.importorskip("gensim", reason="the demo reads gensim's test data (pip install bertgpu[demo])")


def test_demo_runs_tokenizer_prepare_pretrain_export_fill_mask(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "3", "--vocab-size", "2000", "--skip-finetune"]) == 0
    printed = capsys.readouterr().out
    for stage in ("1. bertgpu tokenizer", "2. bertgpu prepare", "3. bertgpu pretrain", "4. bertgpu export"):
        assert stage in printed
    assert "[MASK]" in printed and "demo finished" in printed
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    assert manifest["counts"]["documents"] > 100  # the 106-article dump, redirects skipped
    assert (out / "run" / "hf" / "model.safetensors").exists()
    # Re-running resumes: the stages that are done are not redone, and the run is complete.
    assert main(["demo", "--out", str(out), "--steps", "3", "--vocab-size", "2000", "--skip-finetune"]) == 0
