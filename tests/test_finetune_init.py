"""What a fine-tuning starts from: an init's classifier matched to the task's labels by name
(checked against transformers on the same weights), and the checkpoint a run folder resolves to,
recorded in results.json and compared by `bertgpu glue`."""

from __future__ import annotations

import json
import random
import re
import shutil
import warnings
from pathlib import Path

import _tiny_init
import pytest
import torch
from _tiny_init import SPECIAL

from bertgpu.config.finetune import load_finetune_config
from bertgpu.finetune import build_model, finetune
from bertgpu.tasks.init_model import head_rows

WORDS = "a man dog sleeps runs nobody somebody the is not awake animal moves".split()
VOCAB = SPECIAL + WORDS
MNLI = ("entailment", "neutral", "contradiction")  # the task's order (Hugging Face's)

pytestmark = pytest.mark.usefixtures("one_thread")


def hf_model(folder: Path, head: str, id2label: dict[int, str] | None) -> Path:
    """A tiny transformers classifier saved with `id2label` (None: transformers' LABEL_i), its
    weights drawn with a wide spread so that different inputs get different classes, and a
    word-level tokenizer of VOCAB."""
    import transformers

    n = len(id2label) if id2label else 3
    kw = {"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}} if id2label else {}
    cfg = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64, num_labels=n,
                                  initializer_range=0.5, **kw)  # else the pooler's output is
    # nearly the same for every input, and so is the class
    torch.manual_seed(1)
    cls = {"classification": transformers.BertForSequenceClassification,
           "token_classification": transformers.BertForTokenClassification}[head]
    model = cls(cfg)
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 2.0)
        model.classifier.bias.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}),
                                                  encoding="utf-8")
    return folder


def reference(folder: Path, head: str) -> torch.nn.Module:
    import transformers

    auto = {"classification": transformers.AutoModelForSequenceClassification,
            "token_classification": transformers.AutoModelForTokenClassification}[head]
    return auto.from_pretrained(folder).eval()


def ours(folder: Path, head: str, labels: tuple[str, ...]) -> torch.nn.Module:
    cfg = load_finetune_config(None, ["--hidden_dropout_prob", "0.0"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a pooler or head left fresh is not the point here
        return build_model(str(folder), head, len(labels), cfg, labels=labels).eval()


def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(len(SPECIAL), len(VOCAB), (16, 9), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.zeros_like(ids)}


@pytest.mark.parametrize("head,theirs,task", [
    # MNLI from a head ordered as roberta-large-mnli's (spelled in capitals, as it spells them)
    ("classification", ["CONTRADICTION", "NEUTRAL", "ENTAILMENT"], MNLI),
    # the probe's order; classify's labels (sorted from the training file) go the same way
    ("classification", ["contradiction", "entailment", "neutral"], MNLI),
    ("classification", ["pos", "neg"], ("neg", "pos")),
    # ner: a token classifier tagging in another order
    ("token_classification", ["B-PER", "I-PER", "O"], ("O", "B-PER", "I-PER")),
])
def test_a_head_naming_the_tasks_labels_in_another_order_is_reordered(tmp_path, head, theirs,
                                                                      task):
    """The init's classifier was used row for row, whatever its labels meant: its class 0 was
    scored as the task's class 0 (an MNLI model answering "contradiction" counted as
    "entailment"), and the export renamed its classes over the same rows. Now the rows follow
    the names: for the same input our model gives, under the task's label, transformers' logit
    for that label in the original."""
    init = hf_model(tmp_path / "init", head, dict(enumerate(theirs)))
    x = batch()
    with torch.no_grad():
        ref = reference(init, head)(**x).logits
        got = ours(init, head, task)(**x)["logits"]
    where = {name.lower(): i for i, name in enumerate(theirs)}
    order = [where[name.lower()] for name in task]
    torch.testing.assert_close(got, ref[..., order], rtol=1e-4, atol=1e-5)
    # the same class names, input by input (the export writes `task` as id2label)
    names_ref = [[theirs[i].lower() for i in row] for row in ref.argmax(-1).reshape(16, -1)]
    names_got = [[task[i].lower() for i in row] for row in got.argmax(-1).reshape(16, -1)]
    assert names_got == names_ref
    assert len({n for row in names_ref for n in row}) > 1  # a check that could fail
    rows = dict(head_rows(ours(init, head, task)))
    assert rows["head"] == (f"the init's classifier, rows reordered from its labels "
                            f"({', '.join(theirs)}) to the task's ({', '.join(task)})")
    assert "initialised fresh" not in rows


def test_a_head_naming_other_labels_starts_fresh_and_says_so(tmp_path):
    """An SST-2 head of the right size given to RTE was kept as RTE's head; its rows mean other
    classes. It is now initialised fresh, in the start-up table's "initialised fresh" row."""
    init = hf_model(tmp_path / "init", "classification", {0: "negative", 1: "positive"})
    kept = reference(init, "classification").classifier.weight
    model = ours(init, "classification", ("entailment", "not_entailment"))
    assert not torch.allclose(model.classifier.weight, kept)
    # as a fresh head: the config's initializer_range (0.5), zero bias; the init's had std 2
    assert model.classifier.weight.std() < 1.0 < kept.std() and not model.classifier.bias.any()
    rows = dict(head_rows(model))
    assert rows["initialised fresh"] == ("classifier.bias, classifier.weight (the checkpoint's "
                                         "are another task's head: classifier (labels negative, "
                                         "positive; the task's entailment, not_entailment))")
    assert "head" not in rows
    # Unnamed (LABEL_i) heads are kept as they are: nothing to compare their rows with.
    plain = hf_model(tmp_path / "plain", "classification", None)
    model = ours(plain, "classification", MNLI)
    torch.testing.assert_close(model.classifier.weight,
                               reference(plain, "classification").classifier.weight)
    assert head_rows(model) == []


def test_a_partly_named_head_or_one_without_weights_is_not_the_inits_head(tmp_path):
    """Two edges of match_head. A head naming some of its classes (LABEL_i for the others) is
    named, and here by other labels than the task's: it starts fresh like any other task's head
    (only a head naming none of its classes is kept unchecked). A config naming the task's
    labels in another order whose weights hold no classifier has a fresh head: no "rows
    reordered" row may claim the init's classifier."""
    from safetensors.torch import load_file, save_file

    partly = hf_model(tmp_path / "partly", "classification", {0: "positive", 1: "LABEL_1"})
    kept = reference(partly, "classification").classifier.weight
    model = ours(partly, "classification", ("entailment", "not_entailment"))
    assert not torch.allclose(model.classifier.weight, kept)
    assert dict(head_rows(model))["initialised fresh"].startswith(
        "classifier.bias, classifier.weight (the checkpoint's are another task's head")

    bare = hf_model(tmp_path / "bare", "classification",
                    {0: "contradiction", 1: "entailment", 2: "neutral"})
    weights = load_file(bare / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("classifier.")},
              bare / "model.safetensors", metadata={"format": "pt"})
    rows = dict(head_rows(ours(bare, "classification", MNLI)))
    assert "head" not in rows
    assert rows["initialised fresh"].startswith("classifier.bias, classifier.weight")


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
@pytest.mark.parametrize("head", ["classification", "token_classification"])
def test_only_the_classifier_starts_fresh(tmp_path, arch, head):
    """The fresh head is the architecture's own initialisation of the classifier (BERT's
    normal(0, initializer_range), ModernBERT's truncated normal of hidden_size^-0.5), seeded,
    and nothing else of the model moves."""
    from bertgpu.models import build
    from bertgpu.models.hf_io import LoadReport
    from bertgpu.tasks.init_model import match_head

    fields = ({"model_type": "modernbert", "vocab_size": 64, "hidden_size": 32,
               "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
               "max_position_embeddings": 64, "pad_token_id": 0, "cls_token_id": 2,
               "sep_token_id": 3, "bos_token_id": 2, "eos_token_id": 3}
              if arch == "modernbert" else
              {"model_type": "bert", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
               "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64})
    std = 32 ** -0.5 if arch == "modernbert" else 0.02
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = build.build_model({**fields, "id2label": {"0": "negative", "1": "positive"}},
                                  head, 2)
        with torch.no_grad():  # an init's trained head
            model.classifier.weight.normal_(0.0, 2.0)
            model.classifier.bias.fill_(1.0)
        model.load_report = LoadReport(tmp_path, type(model).__name__, [], [])
        before = {k: v.clone() for k, v in model.state_dict().items()}
        torch.manual_seed(1)
        match_head(model, ["entailment", "not_entailment"])
        after = model.state_dict()
        changed = {k for k in before if not torch.equal(before[k], after[k])}
        assert changed == {"classifier.weight", "classifier.bias"}
        assert not model.classifier.bias.any()
        assert 0.5 * std < model.classifier.weight.std() < 1.5 * std
        models.append(model.classifier.weight.detach())
    assert torch.equal(models[0], models[1])  # the seed decides


def _mnli_folder(root: Path, rng: random.Random) -> Path:
    """MNLI in the official TSV layout (the columns our reader needs) with random sentences."""
    folder = root / "MNLI"
    folder.mkdir(parents=True)
    for split, n in (("train", 8), ("dev_matched", 24), ("dev_mismatched", 24)):
        rows = [f"{i}\t{' '.join(rng.choices(WORDS, k=4))}\t{' '.join(rng.choices(WORDS, k=3))}"
                f"\t{rng.choice(MNLI)}" for i in range(n)]
        (folder / f"{split}.tsv").write_text("index\tsentence1\tsentence2\tgold_label\n"
                                             + "\n".join(rows) + "\n", encoding="utf-8")
    return folder


def test_mnli_from_a_head_of_another_order_scores_and_exports_its_own_classes(tmp_path, capsys):
    """The probe's case end to end: MNLI fine-tuned at lr ~0 from a transformers MNLI model
    whose classes are in another order. The scores are the original model's true accuracy, and
    the export names the same class as the original for every input (it used to rename them:
    "contradiction" became "entailment")."""
    import transformers

    init = hf_model(tmp_path / "mnli_model", "classification",
                    {0: "contradiction", 1: "entailment", 2: "neutral"})
    data = _mnli_folder(tmp_path / "glue", random.Random(0))
    res = finetune("mnli", data, init, tmp_path / "ft",
                   overrides=["--epochs", "1", "--lr", "1e-12", "--global_batch_size", "4"])
    shown = capsys.readouterr().out
    tok = transformers.AutoTokenizer.from_pretrained(init)
    original, export = reference(init, "classification"), reference(tmp_path / "ft" / "model",
                                                                     "classification")
    for split in ("dev_matched", "dev_mismatched"):
        lines = (data / f"{split}.tsv").read_text().splitlines()[1:]
        rows = [line.split("\t") for line in lines]
        enc = tok([r[1] for r in rows], [r[2] for r in rows], padding=True, return_tensors="pt")
        with torch.no_grad():
            before = [original.config.id2label[int(i)] for i in original(**enc).logits.argmax(-1)]
            after = [export.config.id2label[int(i)] for i in export(**enc).logits.argmax(-1)]
        assert after == before, split
        assert len(set(before)) > 1
        truth = 100.0 * sum(p == r[3] for p, r in zip(before, rows, strict=True)) / len(rows)
        assert res["metrics"][split]["accuracy"] == pytest.approx(truth), split
    assert "rows reordered from its labels (contradiction, entailment, neutral)" in shown


# --------------------------------------------------------------------------------------------
# The checkpoint behind a run folder


def _run_folder(root: Path, steps: tuple[int, ...]) -> Path:
    """A bertgpu run folder: tokenizer/ and sealed checkpoints/step_N of different weights."""
    words = sorted({w for p in (Path(__file__).parent / "fixtures" / "glue" / "SST-2").glob("*")
                    for w in re.findall(r"[a-z0-9]+|[^\sa-z0-9]", p.read_text().lower())})
    base = _tiny_init.tiny_init(root / "src", [*SPECIAL, *words])
    run = root / "run"
    shutil.copytree(base.parent / "tok", run / "tokenizer")
    for step in steps:
        add_step(run, step, base)
    return run


def add_step(run: Path, step: int, base: Path) -> Path:
    """run/checkpoints/step_N: `base`'s weights moved by N (each step its own weights), sealed."""
    from safetensors.torch import load_file, save_file

    from bertgpu import fsutil

    folder = run / "checkpoints" / f"step_{step}"
    folder.mkdir(parents=True)
    shutil.copy(base / "config.json", folder / "config.json")
    weights = load_file(base / "model.safetensors")
    save_file({k: v + 1e-3 * step if v.is_floating_point() else v for k, v in weights.items()},
              folder / "model.safetensors")
    fsutil.seal(folder)
    return folder


def test_glue_records_the_checkpoint_and_refuses_seeds_of_another(tmp_path, capsys, monkeypatch):
    """`--init RUN` recorded only "RUN": a glue re-run after pretraining saved a newer
    checkpoint kept seed 1 (from step 20) beside a new seed 2 (from step 25) in one table. Now
    results.json and the start-up table name the checkpoint (folder, step, sha256), every run
    of one glue command starts from the one it found first, and seeds of another are refused."""
    from bertgpu import finetune as finetune_mod
    from bertgpu.cli import main

    run = _run_folder(tmp_path, (20,))
    base = tmp_path / "src" / "init"
    out = tmp_path / "glue"
    args = ["glue", "--data-dir", str(Path(__file__).parent / "fixtures" / "glue"), "--init",
            str(run), "--out", str(out), "--tasks", "sst2", "--epochs", "1", "--max_seq_len",
            "32", "--global_batch_size", "4"]
    # Pretraining saves step_25 while the first seed trains: the second starts from step 20 too.
    real = finetune_mod.finetune

    def and_pretraining_goes_on(*a, **k):
        res = real(*a, **k)
        if not (run / "checkpoints" / "step_25").exists():
            add_step(run, 25, base)
        return res

    monkeypatch.setattr(finetune_mod, "finetune", and_pretraining_goes_on)
    assert main([*args, "--seeds", "1", "2"]) == 0
    step20 = (run / "checkpoints" / "step_20").resolve()
    sha = json.loads((step20 / "checksums.json").read_text())["files"]["model.safetensors"]
    want = {"path": str(step20), "step": 20, "sha256": sha["sha256"]}
    for seed in (1, 2):
        res = json.loads((out / "SST-2" / f"seed_{seed}" / "results.json").read_text())
        assert res["init_checkpoint"] == want, seed
    shown = capsys.readouterr().out
    assert re.search(rf"init checkpoint +{re.escape(str(step20))} \(step 20, model\.safetensors "
                     rf"sha256 {sha['sha256'][:12]}\)", shown)
    assert json.loads((out / "glue_results.json").read_text())["init_checkpoint"] == want
    assert f"Model: `{run}` (checkpoint `{step20}`, step 20)" in shown
    # The same command again: the run folder now stands for step_25.
    monkeypatch.setattr(finetune_mod, "finetune", real)
    assert main([*args, "--seeds", "1", "2", "3"]) == 2
    err = capsys.readouterr().err
    assert (f"seed_1/results.json: made with init {step20} (now "
            f"{(run / 'checkpoints' / 'step_25').resolve()}); a table would mix" in err), err
    assert not (out / "SST-2" / "seed_3").exists()
    # The run folder and its step_20 folder are one checkpoint (the sha256 says so).
    shutil.rmtree(run / "checkpoints" / "step_25")
    capsys.readouterr()
    assert main([*args[:4], str(step20), *args[5:], "--seeds", "1", "2"]) == 0
    assert capsys.readouterr().out.count("results.json exists, not re-run") == 2


def test_finetune_records_the_checkpoint_it_loaded(tmp_path, capsys):
    """`finetune --init RUN` with a damaged newest checkpoint took the one before with only a
    warning; results.json and the start-up table said `init RUN`, not which."""
    run = _run_folder(tmp_path, (5, 10))
    (run / "checkpoints" / "step_10" / "model.safetensors").write_bytes(b"damaged")
    with pytest.warns(UserWarning, match=r"step_10: skipped"):
        res = finetune("sst2", Path(__file__).parent / "fixtures" / "glue", run, tmp_path / "ft",
                       overrides=["--epochs", "1", "--max_seq_len", "32",
                                  "--global_batch_size", "4"])
    step5 = (run / "checkpoints" / "step_5").resolve()
    assert res["init"] == str(run)
    assert res["init_checkpoint"]["path"] == str(step5) and res["init_checkpoint"]["step"] == 5
    assert re.search(rf"init checkpoint +{re.escape(str(step5))} \(step 5, ",
                     capsys.readouterr().out)


def test_finetune_loads_the_checkpoint_it_records_while_pretraining_goes_on(tmp_path,
                                                                            monkeypatch):
    """Pretraining saves step_10 after `finetune --init RUN` resolved RUN to step_5 and before
    the model loads: the weights it starts from are step_5's, the checkpoint results.json
    records, not the run folder's newest at loading time."""
    from safetensors.torch import load_file

    from bertgpu import finetune as finetune_mod

    run = _run_folder(tmp_path, (5,))
    resolve, build = finetune_mod.resolve_init, finetune_mod.build_model
    loaded = {}

    def resolve_then_a_step_is_saved(init):
        ckpt = resolve(init)
        add_step(run, 10, tmp_path / "src" / "init")
        return ckpt

    def build_and_keep_the_weights(*args, **kwargs):
        model = build(*args, **kwargs)
        loaded.update({k: v.detach().clone() for k, v in model.state_dict().items()})
        return model

    monkeypatch.setattr(finetune_mod, "resolve_init", resolve_then_a_step_is_saved)
    monkeypatch.setattr(finetune_mod, "build_model", build_and_keep_the_weights)
    res = finetune("sst2", Path(__file__).parent / "fixtures" / "glue", run, tmp_path / "ft",
                   overrides=["--epochs", "1", "--max_seq_len", "32", "--global_batch_size", "4"])
    assert res["init_checkpoint"]["step"] == 5
    step5, step10 = (load_file(run / "checkpoints" / f"step_{n}" / "model.safetensors")
                     for n in (5, 10))
    shared = sorted(k for k in step5 if k in loaded)
    word = "bert.embeddings.word_embeddings.weight"
    assert word in shared

    def rows(k: str) -> torch.Tensor:  # the model pads its vocabulary rows (here 76 -> 128)
        return loaded[k][: step5[k].shape[0]]

    assert [k for k in shared if not torch.equal(rows(k), step5[k])] == []
    assert not torch.equal(rows(word), step10[word])
