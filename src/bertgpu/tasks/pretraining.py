"""Pretraining as a task of the training loop: masked language modelling (and NSP).

The shard set's manifest decides the objective; the loader (data/loaders.py) hands each rank its
micro batches of every step from one deterministic global order with masks fixed by
(seed, epoch, sample), so resuming, at any world size, continues with exactly the next samples.

Loss terms are sums (MLM cross-entropy over masked tokens, NSP over sequences) with matching
counts, which the engine normalises over the whole step on every rank. Evaluation measures MLM
loss, accuracy and perplexity (and NSP accuracy) on the held-out split with masks at a fixed rate
(`data.eval_mask_rate`, 15% by default), so that recipes that train with other rates compare.
"""

from __future__ import annotations

import filecmp
import hashlib
import math
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bertgpu.batch import IGNORE_INDEX, mark_rows_dynamic
from bertgpu.config.schema import resolve_with_nsp
from bertgpu.data.loaders import PretrainLoader, iter_eval_batches
from bertgpu.data.masking import MaskingConfig
from bertgpu.data.shards import ShardSet, check_compatible
from bertgpu.errors import BertgpuError
from bertgpu.train import distributed, sharding
from bertgpu.train.engine import StepResult

if TYPE_CHECKING:
    from bertgpu.train.continued import InitSource


class PretrainData:
    """The train and validation shard sets of a run, checked against the config."""

    def __init__(self, data_dir: str | Path, objective: str | None, with_nsp: bool | None) -> None:
        self.dir = Path(data_dir)
        self.train = ShardSet(self.dir, "train")
        _check_tokenizer_copy(self.train)
        if len(self.train) == 0:
            raise BertgpuError(f"{self.train.manifest_path}: the train split has no sequences")
        self.val: ShardSet | None = None
        if self.train.manifest.splits.get("validation", {}).get("sequences", 0) > 0:
            self.val = ShardSet(self.dir, "validation")
        found = self.train.objective
        if objective and objective != found:
            pairs = (" (with --train.with_nsp false, MLM alone on its sentence pairs)"
                     if found == "mlm+nsp" else "")
            raise BertgpuError(f"{self.train.manifest_path}: objective is {found!r} but the config "
                               f"asks for data.objective {objective!r}; expected shards prepared "
                               f"with --objective {objective}, or --data.objective none to train "
                               f"on these{pairs}")
        self.with_nsp = resolve_with_nsp(with_nsp, found, str(self.train.manifest_path))
        self.init: tuple[str, Path | None] | None = None
        """(--init as given, its tokenizer folder or None when it has no tokenizer files), set
        by `open_checked`: the model's special ids then come from the init, so `check_model`
        names it instead of suggesting model.pad_token_id, a setting --init refuses."""
        self._init_unchecked: str | None = None  # an --init check_init found no tokenizer in

    def unchecked_init_note(self) -> str | None:
        """The start-up warning of an --init without tokenizer files (`check_init`)."""
        if self._init_unchecked is None:
            return None
        return (f"--init {self._init_unchecked} has no tokenizer files (tokenizer.json or "
                "vocab.txt), so whether the shards' tokenizer matches the model cannot be "
                "checked: only their vocabulary size and special ids are")

    def whole_word_note(self, whole_word_masking: bool) -> str | None:
        """The start-up warning of shards prepared with word starts (`prepare
        --whole-word-segmenter`) trained without data.whole_word_masking: the starts go unused."""
        train = self.train
        if whole_word_masking or not train.has_word_starts:
            return None
        return (f"{train.data_dir}: the shards carry {train.manifest.whole_word_segmenter} word "
                "starts but data.whole_word_masking is false: masking single tokens; expected "
                "--data.whole_word_masking true to mask whole words")

    def check_model(self, model_fields: Mapping[str, Any], tokenizer_hash: str | None) -> None:
        # The special ids a config declares (BERT: [PAD]; ModernBERT also [CLS], [SEP]) must be
        # the shards': the [PAD] row of the embedding gets no gradient, and a run continued
        # from a published model must see its tokens where it learned them.
        special = {key: model_fields.get(f"{key}_token_id") for key in ("pad", "cls", "sep")}
        check_compatible(self.train, int(model_fields["vocab_size"]),
                         int(model_fields["max_position_embeddings"]),
                         tokenizer_hash=tokenizer_hash,
                         type_vocab_size=model_fields.get("type_vocab_size"),
                         special_ids={k: v for k, v in special.items() if v is not None},
                         special_mismatch=self._init_special_mismatch if self.init else None)

    def _init_special_mismatch(self, key: str, shard_id: int, model_id: int) -> str:
        """The special-id error of a continued run (`check_compatible`'s special_mismatch)."""
        assert self.init is not None  # only passed once open_checked has set it
        init, tokenizer_dir = self.init
        ids = (f"special token {key} has id {shard_id} in the shards but the model's "
               f"{key}_token_id is {model_id}")
        if tokenizer_dir is None:
            # Nothing says which tokenizer the model was trained with: only the ids disagree.
            return (f"{ids}; --init {init} has no tokenizer files (tokenizer.json or vocab.txt), "
                    "so whether the shards' tokenizer matches the model could not be checked; "
                    "expected shards made with the model's own tokenizer (bertgpu prepare "
                    f"--tokenizer THAT_TOKENIZER, or copy its files into {init})")
        # check_init passed: the shards are the init's tokenizer's, its config.json disagrees.
        return (f"{ids} (--init {init}), while its tokenizer {tokenizer_dir} gives {key} id "
                f"{shard_id} as the shards do; expected the init's config.json and tokenizer "
                f"files to agree ({key}_token_id {shard_id} in its config.json if that tokenizer "
                "is the one the model was trained with)")

    def check_init(self, tokenizer_dir: Path | None, init: str) -> None:
        """Shards of a continued run must come from the init's tokenizer (`bertgpu prepare
        --tokenizer INIT`): the same vocabulary and the same special ids. An init without a
        tokenizer folder is checked by the config's sizes and ids only (`check_model`)."""
        from bertgpu.data.tokenizer_folder import special_token_ids, tokenizer_hash

        if tokenizer_dir is None:
            self._init_unchecked = init  # a start-up note (`unchecked_init_note`)
            return
        path, expected = self.train.manifest_path, tokenizer_hash(tokenizer_dir)
        if self.train.tokenizer_hash != expected:
            raise BertgpuError(f"{path}: tokenizer_hash {self.train.tokenizer_hash} differs from "
                               f"--init's tokenizer {tokenizer_dir} ({expected}); expected shards "
                               f"made with bertgpu prepare --tokenizer {tokenizer_dir}")
        ids = special_token_ids(tokenizer_dir)
        if ids != self.train.special_tokens:
            raise BertgpuError(f"{path}: special_tokens {self.train.special_tokens} differ from "
                               f"--init's tokenizer {tokenizer_dir} ({ids}); expected shards made "
                               f"with bertgpu prepare --tokenizer {tokenizer_dir}")


def _check_tokenizer_copy(shards: ShardSet) -> None:
    """The shard set's tokenizer/ (prepare's copy, which the run copies and exports with the
    model) holds a tokenizer: checked with the shards, before the run folder is made. Found
    missing by `copy_tokenizer`, it was a traceback, or an error naming the run's copy, with
    config.toml and the lock file left in --out."""
    folder = shards.tokenizer_dir
    again = (f"expected the copy of the tokenizer that `bertgpu prepare` writes beside "
             f"{shards.manifest_path.name} (prepare again, or copy the tokenizer the shards were "
             "made with there)")
    if not folder.is_dir():
        what = "a file, not a folder" if folder.exists() else "missing from the shard set"
        raise BertgpuError(f"{folder}: {what}; {again}")
    if not any((folder / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
        raise BertgpuError(f"{folder}: neither tokenizer.json nor vocab.txt found; {again}")


class PretrainTask:
    """MLM (+NSP) on a shard set; see the module docstring."""

    def __init__(self, data: PretrainData, model: torch.nn.Module, loader: PretrainLoader,
                 masking: MaskingConfig, eval_masking: MaskingConfig, *, seed: int, run_dir: Path,
                 eval_sequences: int, autocast: Any, info: distributed.DistInfo,
                 allow_data_change: bool = False, rows_vary: bool = False) -> None:
        self.data, self.model, self.loader = data, model, loader
        self.masking, self.eval_masking = masking, eval_masking
        self.seed, self.run_dir, self.eval_sequences = seed, Path(run_dir), eval_sequences
        self.autocast, self.info = autocast, info
        self.device = torch.device(info.device)
        self.with_nsp = data.with_nsp
        self.allow_data_change = allow_data_change
        self.rows_vary = rows_vary  # load balancing re-shares: micro batches change size
        # read once, as the shard set was: `state_dict` runs before every step
        self._manifest_sha256 = hashlib.sha256(data.train.manifest_path.read_bytes()).hexdigest()
        # step (0-based) -> the epoch of its samples, noted when its batches are taken: by the
        # time a step is logged the loader may have moved on (a stop signal takes the next
        # step's batches before the step is dropped), so its position no longer says.
        self._epochs: dict[int, int] = {}
        if data.val is None and info.is_main:
            warnings.warn(f"{data.train.manifest_path}: the validation split is empty, so "
                          "evaluation is skipped (prepare with --validation-fraction > 0 to "
                          "measure held-out loss)", stacklevel=1)

    # -- training ---------------------------------------------------------------------------------
    def micro_batches(self, step: int) -> list[dict[str, torch.Tensor]]:
        # the loader's cursor is the state; `step` agrees with it
        last = self.loader.position + self.loader.global_batch_size - 1  # the step's last sample
        self._epochs = {s: e for s, e in self._epochs.items() if s >= step - 1}
        self._epochs[step] = last // len(self.data.train) + 1
        return self.loader.next_step()

    def loss(self, model: torch.nn.Module, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        # batch_meta: the loader's host-side layout (padding, unpad indices, masked rows), so the
        # forward and backward never wait on the host.
        if self.rows_vary:
            mark_rows_dynamic(batch)  # one compiled graph for the sizes re-sharing makes
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"], labels=batch["labels"],
                    next_sentence_label=batch.get("next_sentence_label") if self.with_nsp else None,
                    batch_meta=batch.get("batch_meta"))
        terms = {"mlm": out.mlm_loss_sum, "_mlm_correct": out.mlm_correct}
        if self.with_nsp:
            terms["nsp"] = out.nsp_loss_sum
            terms["_nsp_correct"] = out.nsp_correct
        return terms

    def counts(self, batch: Mapping[str, Any]) -> dict[str, int]:
        # Host-side counts from CPU tensors: "tokens" (real, non-pad) and "sequences" have no loss
        # term; the engine sums them with the loss normalisers for tokens/s and MFU.
        counts = {"mlm": int((batch["labels"] != IGNORE_INDEX).sum()),
                  "tokens": int(batch["attention_mask"].sum()),
                  "sequences": int(batch["input_ids"].shape[0])}
        if self.with_nsp:
            counts["nsp"] = int(batch["input_ids"].shape[0])
        return counts

    def log_scalars(self, res: StepResult) -> dict[str, Any]:
        """MLM (and NSP) loss and accuracy of step `res.step`, and its `epoch`: the pass over the
        training split that the step's samples came from, 1-based as fine-tuning's (a step that
        straddles the end of a pass counts in the epoch of its last sample). The masking's epoch
        index (data/masking.py, `loader.epoch`) is 0-based: this minus 1."""
        out: dict[str, Any] = {
            "mlm_loss": res.losses.get("mlm"),
            "mlm_acc": res.extras.get("_mlm_correct", 0.0) / max(res.counts.get("mlm", 0), 1),
            "epoch": self._epochs.get(res.step - 1),
        }
        if self.with_nsp:
            out["nsp_loss"] = res.losses.get("nsp")
            out["nsp_acc"] = res.extras.get("_nsp_correct", 0.0) / max(res.counts.get("nsp", 0), 1)
        return out

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self, step: int, train_loss: float | None) -> dict[str, float]:
        """MLM loss/accuracy (and NSP accuracy) on the first `train.eval_sequences` of the
        held-out split (whatever the micro batch and device count), all ranks together:
        batches are sharded over ranks with no collective inside the loop, one all-reduce after
        (a sharded model's forwards are collectives: there every rank runs as many as the rank
        with the most batches, the extra ones on a repeated batch and not counted)."""
        if self.data.val is None:
            return {}
        # mlm_loss, mlm_n, mlm_correct, nsp_correct, nsp_n
        sums = torch.zeros(5, dtype=torch.float64)
        mb, limit = self.loader.micro_batch_size, self.eval_sequences or None
        self.model.eval()
        with torch.no_grad():
            done = 0
            for batch in iter_eval_batches(self.data.val, self.eval_masking, mb, seed=self.seed,
                                           max_samples=limit, rank=self.info.rank,
                                           world_size=self.info.world_size):
                out = self._eval_forward(batch)
                done += 1
                sums[0] += float(out.mlm_loss_sum)
                sums[1] += float(out.mlm_count)
                sums[2] += float(out.mlm_correct)
                if self.with_nsp:
                    sums[3] += float(out.nsp_correct)
                    sums[4] += float(out.nsp_count)
            if sharding.is_sharded(self.model):
                n = -(-min(len(self.data.val), limit or len(self.data.val)) // mb)
                for _ in range(-(-n // self.info.world_size) - done):
                    self._eval_forward(next(iter_eval_batches(self.data.val, self.eval_masking, mb,
                                                              seed=self.seed, max_batches=1)))
        self.model.train()
        sums = distributed.all_reduce_sum(sums.to(distributed.collective_device())).cpu()
        result: dict[str, float] = {}
        if sums[1] > 0:
            loss = float(sums[0] / sums[1])
            result["val_mlm_loss"] = loss
            result["val_mlm_acc"] = float(sums[2] / sums[1])
            result["val_mlm_perplexity"] = math.exp(min(loss, 50.0))
        if sums[4] > 0:
            result["val_nsp_acc"] = float(sums[3] / sums[4])
        return result

    def _eval_forward(self, batch: Mapping[str, Any]) -> Any:
        batch = {k: v.to(self.device) for k, v in batch.items()}
        with self.autocast():
            nsp = batch.get("next_sentence_label") if self.with_nsp else None
            return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              token_type_ids=batch["token_type_ids"], labels=batch["labels"],
                              next_sentence_label=nsp, batch_meta=batch.get("batch_meta"))

    # -- state and result ------------------------------------------------------------------------
    def data_identity(self) -> dict[str, Any]:
        """What decides the stream of training samples: the shard set (its manifest, byte for
        byte) and the masking. Resuming with any of them changed would silently train on
        another stream, so it is an error unless the user says so."""
        return {"manifest_sha256": self._manifest_sha256,
                "mask_rate": float(self.masking.mask_rate),
                "whole_word_masking": bool(self.masking.whole_word)}

    def shares(self) -> list[int]:
        """Sequences of each rank per step (load balancing; equal by default)."""
        return list(self.loader.shares)

    def set_shares(self, shares: list[int]) -> None:
        self.loader.set_shares(shares)

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self.loader.state_dict(),
                "tokenizer_hash": self.data.train.tokenizer_hash,
                "data_identity": self.data_identity(), "shares": self.shares()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        saved, now = state.get("data_identity"), self.data_identity()
        if saved is not None and not self.allow_data_change:
            changed = [k for k in now if saved.get(k) != now[k]]
            if changed:
                what = ", ".join(f"{k} {saved.get(k)!r} -> {now[k]!r}" if k != "manifest_sha256"
                                 else f"the shard set ({self.data.train.manifest_path} differs)"
                                 for k in changed)
                raise BertgpuError(f"{self.run_dir}: resuming with changed data: {what}; expected "
                                   "the checkpoint's data and masking (pass --allow-data-change "
                                   "to continue anyway)")
        self.loader.load_state_dict(state["loader"])
        shares = state.get("shares")
        # another world size or global batch starts from equal shares and measures again
        if (shares and len(shares) == self.info.world_size
                and sum(shares) == self.loader.global_batch_size):
            self.loader.set_shares(list(shares))

    def export(self, step: int, state_dict: Mapping[str, torch.Tensor] | None = None) -> Path:
        from bertgpu.models.hf_export import save_pretrained

        # A sharded model's weights come gathered (its parameters are shards).
        weights = dict(state_dict) if state_dict is not None else None
        folder = save_pretrained(self.model, self.run_dir / "hf",
                                 tokenizer=self.run_dir / "tokenizer", state_dict=weights)
        print(f"done: step {step}; Hugging Face export in {folder}", flush=True)
        return folder

    def close(self) -> None:
        self.loader.close()


def copy_tokenizer(data: PretrainData, run_dir: Path) -> None:
    """RUN_DIR/tokenizer: the shards' tokenizer, exported with the model (rank 0). Copied whole
    or not at all (a scratch folder renamed into place), and again when its files differ from
    the shards' tokenizer: a copy cut short (a full disk) went silently into every checkpoint
    and the export, which transformers then could not load."""
    from bertgpu.fsutil import make_scratch, replace_dir

    src, dst = Path(data.train.tokenizer_dir), Path(run_dir) / "tokenizer"
    names = sorted(p.name for p in src.iterdir() if p.is_file())
    if dst.is_dir() and sorted(p.name for p in dst.iterdir() if p.is_file()) == names:
        _, differ, unread = filecmp.cmpfiles(src, dst, names, shallow=False)
        if not differ and not unread:
            return
    if dst.is_symlink():  # a link someone made: replaced by the copy, its target left alone
        dst.unlink()
    elif dst.exists():  # a copy cut short, or other shards' (resumed with --allow-data-change)
        warnings.warn(f"{dst}: replaced by the tokenizer of {src} (their files differed); "
                      "exports from now on carry it", stacklevel=2)
    tmp = make_scratch(dst.with_name(dst.name + ".tmp"), dst)
    for name in names:  # one by one: a full disk raises its OSError (copytree's shutil.Error
        shutil.copy2(src / name, tmp / name)  # has no errno, and the CLI could not say it)
    replace_dir(tmp, dst)


def checkpoint_files(text: str, model: Any, run_dir: Path) -> dict[str, str | bytes]:
    """Beside a checkpoint's weights (in Hugging Face's layout): config.toml (`text`), and the
    config.json and tokenizer files that make the folder one transformers' from_pretrained and
    pipelines load (without a tokenizer, AutoTokenizer made one of 5 tokens: every word [UNK])."""
    import json

    from bertgpu.models.hf_export import hf_config, tokenizer_files

    return {"config.toml": text,
            "config.json": json.dumps(hf_config(model), indent=2, sort_keys=True) + "\n",
            **tokenizer_files(run_dir / "tokenizer", model.config.max_position_embeddings,
                              getattr(model.config, "type_vocab_size", 1) > 1)}


def open_checked(init: str, data: PretrainData, warn: bool = True) -> InitSource:
    """The InitSource of `init`, once `data` (a PretrainData) has passed `check_init`: shards
    made with its tokenizer. Callers run this before `data.check_model`: another tokenizer is
    then named as such, and the init recorded on `data` makes check_model's special-id error
    speak of the init's files, not of model.pad_token_id (a setting --init refuses). `warn`
    False skips an init without a tokenizer silently (a launcher: each worker warns)."""
    from bertgpu.data.tokenizer_folder import find_tokenizer_folder
    from bertgpu.train.continued import InitSource

    src = InitSource.open(init)
    tokenizer = find_tokenizer_folder(src.folder)
    data.init = (init, tokenizer)
    if tokenizer is not None or warn:
        data.check_init(tokenizer, init)
    return src
