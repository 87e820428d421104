"""A Hugging Face folder given as --init (no checksums.json, as transformers and `bertgpu export`
write it) is identified by its weights, not only its path: re-exported to the same path with
other weights (pretraining went further), a stopped fine-tuning run of the old weights is not
resumed as if it were of the new ones, and glue does not reuse its finished tasks."""

from __future__ import annotations

import hashlib

from _tiny_init import SPECIAL, tiny_init

from bertgpu.tasks.init_model import checkpoint_change, resolve_init


def test_a_hugging_face_folder_is_identified_by_its_weights(tmp_path):
    init = tiny_init(tmp_path, SPECIAL + ["good", "bad"])
    weights = init / "model.safetensors"
    before = resolve_init(str(init))
    assert before.sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert checkpoint_change(before.record(), str(init), resolve_init(str(init))) is None

    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1.0  # the same folder, saved again with other weights
    save_file(tensors, weights, metadata={"format": "pt"})
    after = resolve_init(str(init))
    assert after.path == before.path and after.sha256 != before.sha256
    change = checkpoint_change(before.record(), str(init), after)
    assert change is not None and f"sha256 {before.sha256[:12]}" in change

