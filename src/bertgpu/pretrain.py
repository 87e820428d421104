"""Pretraining: one entry point for 1 device, N local devices, or many machines.

    bertgpu pretrain configs/tiny.toml --data data/ --out runs/tiny
    bertgpu pretrain configs/bert-base.toml --data data/ --out runs/base --nproc auto   # every GPU
    bertgpu pretrain configs/tiny.toml --data data/ --out runs/tiny --nproc 2          # 2 gloo CPU workers
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        --rdzv-id JOB --max-restarts 3 -m bertgpu pretrain configs/bert-base.toml --data data/ --out runs/base

(`examples/slurm_pretrain.sbatch` is the Slurm version; `examples/multinode.md` explains it.)

Running the same command again on the same `--out` resumes from the latest checkpoint, bitwise
exactly on CPU in fp32; so does a torchrun restart (`--max-restarts`). Rank 0 picks the
checkpoint and broadcasts its step, so every rank resumes from the same one (`--out` must be on
a filesystem every node sees). Resuming at another world size continues with exactly the next
samples. SIGTERM (a preemption) writes a checkpoint before exiting.

Every decision that ends or skips work is collective, so ranks never disagree about the step
they are on: the budget clock is rank 0's (broadcast), a preemption on any rank stops all
(`any_true` once per step), a non-finite step is skipped everywhere (engine), and the loader is
infinite over epochs. Evaluation shards batches unevenly over ranks but runs no collective
inside its loop (the unwrapped model, one all-reduce of the sums afterwards).

Throughput lines carry tokens/s and sequences/s in total and per device, optimizer steps/s,
`data_wait_share` (rank 0's time in `loader.next_step()` / loop time) and, with several ranks,
`comm_share`: rank 0's *exposed* gradient all-reduce time / loop time (see `distributed.CommTimer`).

The loop body is `loader.next_step()` -> `engine.train_step()` -> log / evaluate / checkpoint;
everything that must be exactly right (accumulation, DDP sync, AMP, clipping, skipping) lives in
`engine.py`, the data order and masks in `data.py`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError

ACCEPTS_OVERRIDES = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?", help="TOML recipe, e.g. configs/tiny.toml")
    parser.add_argument(
        "--nproc",
        default=None,
        help="worker processes on this machine: N, or auto (every visible GPU); "
        "starts torch's elastic launcher for you",
    )
    parser.add_argument("--help-config", action="store_true", help="list every config key and exit")
    # Declared (not left to the override parser) so `--data D` is never mistaken for the recipe.
    parser.add_argument("--data", default=None, help="shard set from bertgpu prepare (data.dir)")
    parser.add_argument("--out", default=None, help="run folder (out); re-running resumes from it")
    parser.epilog = (
        "Overrides: --section.key value (or =value), e.g. --train.max_steps 100 "
        "--train.global_batch_size 256 --seed 1 --data DIR --out RUN_DIR"
    )


def main(args: argparse.Namespace) -> int:
    from bertgpu.train import config, distributed, overrides

    for key in ("data", "out"):
        if getattr(args, key, None) is not None:
            args.overrides = [f"--{key}={getattr(args, key)}", *args.overrides]
    if args.help_config:
        print(overrides.format_help(config.PretrainConfig))
        return 0
    if args.nproc is not None and "WORLD_SIZE" not in os.environ:
        n = distributed.resolve_nproc(args.nproc)
        # Validate before launching N workers, so a typo fails once, not N times.
        cfg = config.load_config(args.recipe, args.overrides)
        if not isinstance(cfg.train.micro_batch_size, str):
            config.resolve_batch(cfg.train.global_batch_size, cfg.train.micro_batch_size, n)
        _check_gpu_count(n, cfg.train.device)
        if n > 1:
            # argparse consumed --nproc, so the children (which also see WORLD_SIZE) never
            # launch again; the recipe and the overrides pass through unchanged.
            argv = ["pretrain", *([args.recipe] if args.recipe else []), *args.overrides]
            return distributed.launch_local(n, argv)
    cfg = config.load_config(args.recipe, args.overrides)
    result = run(cfg)
    return 143 if result.preempted else 0


def _check_gpu_count(n: int, device: str) -> None:
    """One process per GPU: refuse more local processes than visible GPUs when training on CUDA."""
    if device not in ("auto", "cuda"):
        return
    import torch

    if torch.cuda.is_available() and n > torch.cuda.device_count():
        raise BertgpuError(
            f"--nproc {n}: only {torch.cuda.device_count()} GPUs are visible; expected at most "
            f"{torch.cuda.device_count()} (or --train.device cpu for CPU workers)"
        )


@dataclass
class RunResult:
    """What `run` returns: where things are and the last numbers."""

    run_dir: Path
    step: int
    export_dir: Path | None = None
    preempted: bool = False
    last_eval: dict[str, float] = field(default_factory=dict)


def run(cfg: Any) -> RunResult:
    """Train according to `cfg` (a validated `config.PretrainConfig`)."""
    from bertgpu.train import distributed

    info = distributed.init_distributed(cfg.train.device)
    try:
        return _Trainer(cfg, info).fit()
    finally:
        distributed.destroy()


class _Preemption:
    """SIGTERM/SIGINT set a flag; the loop checks it collectively and checkpoints before exit."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. called from a test thread)
                pass

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _Trainer:
    def __init__(self, cfg: Any, info: Any) -> None:
        import torch

        from bertgpu.data import loaders, masking, shards
        from bertgpu.models.bert import BertConfig, BertForPreTraining
        from bertgpu.train import config as config_mod
        from bertgpu.train import distributed, optim, overrides
        from bertgpu.train.engine import Engine
        from bertgpu.train.schedule import BudgetClock, warmup_fraction

        self.cfg, self.info = cfg, info
        if not cfg.out:
            raise BertgpuError("config: out is not set; give --out RUN_DIR")
        if not cfg.data.dir:
            raise BertgpuError("config: data.dir is not set; give --data DIR (made by bertgpu prepare)")
        self.run_dir = Path(cfg.out)
        self.data_dir = Path(cfg.data.dir)
        self.device = torch.device(info.device)

        # Data first: its manifest decides the vocabulary check and the objective.
        self.shards = shards.ShardSet(self.data_dir, "train")
        if len(self.shards) == 0:
            raise BertgpuError(f"{self.shards.manifest_path}: the train split has no sequences")
        self.val = None
        if self.shards.manifest["splits"].get("validation", {}).get("sequences", 0) > 0:
            self.val = shards.ShardSet(self.data_dir, "validation")
        objective = self.shards.objective
        if cfg.data.objective and cfg.data.objective != objective:
            raise BertgpuError(
                f"{self.shards.manifest_path}: objective is {objective!r} but the config asks for "
                f"data.objective {cfg.data.objective!r}"
            )
        self.with_nsp = cfg.train.with_nsp if cfg.train.with_nsp is not None else objective == "mlm+nsp"
        if self.with_nsp and objective != "mlm+nsp":
            raise BertgpuError(
                f"{self.shards.manifest_path}: train.with_nsp needs data prepared with "
                f"--objective mlm+nsp (this shard set is {objective!r})"
            )

        model_fields = overrides.config_to_dict(cfg.model)
        self.bert_config = BertConfig.from_dict(model_fields)
        self.latest = self._agreed_checkpoint()
        self.resume_state: dict[str, Any] | None = None
        self.resume_model: dict[str, Any] | None = None
        if self.latest is not None:
            from bertgpu.train.checkpoint import load_checkpoint

            self.resume_model, self.resume_state = load_checkpoint(self.latest)
        expected_hash = self.resume_state.get("tokenizer_hash") if self.resume_state else None
        shards.check_compatible(
            self.shards,
            self.bert_config.vocab_size,
            self.bert_config.max_position_embeddings,
            tokenizer_hash=expected_hash,
            type_vocab_size=self.bert_config.type_vocab_size,
        )

        # Batch arithmetic, validated before any model is built.
        self.world = info.world_size
        micro = cfg.train.micro_batch_size
        if micro == "auto":
            micro = self._auto_micro_batch()
        self.accumulation = config_mod.resolve_batch(cfg.train.global_batch_size, micro, self.world)
        self.peak_lr = config_mod.scaled_lr(
            cfg.optim.lr, cfg.train.global_batch_size, cfg.optim.reference_batch_size, cfg.optim.lr_scaling
        )

        # Same seed on every rank: identical initial weights (DDP also broadcasts rank 0's).
        torch.manual_seed(cfg.seed)
        self.model = BertForPreTraining(self.bert_config, with_nsp=self.with_nsp).to(self.device)
        self.model.unpad_enable(cfg.train.unpad)
        self.model.gradient_checkpointing_enable(cfg.train.gradient_checkpointing)
        self.optimizer = optim.build_optimizer(
            self.model,
            cfg.optim.name,
            self.peak_lr,
            weight_decay=cfg.optim.weight_decay,
            betas=tuple(cfg.optim.betas),
            eps=cfg.optim.eps,
        )
        # Dropout streams differ per rank (different data, different noise), from (seed, rank).
        torch.manual_seed(cfg.seed * 1000003 + info.rank)

        self.budget = None
        if cfg.train.budget_hours:
            self.budget = BudgetClock(cfg.train.budget_hours * 3600.0)
        self.max_steps = int(cfg.train.max_steps or 0)
        if self.budget is None and self.max_steps <= 0:
            raise BertgpuError("config: train.max_steps must be positive unless train.budget_hours is set")
        self.warmup = warmup_fraction(cfg.schedule.warmup_steps, cfg.schedule.warmup_fraction, self.max_steps)

        self.masking = masking.MaskingConfig(mask_rate=cfg.data.mask_rate, whole_word=cfg.data.whole_word_masking)
        self.loader = loaders.PretrainLoader(
            self.shards,
            self.masking,
            cfg.train.global_batch_size,
            micro,
            rank=info.rank,
            world_size=self.world,
            seed=cfg.seed,
            num_workers=cfg.data.num_workers,
            pin_memory=self.device.type == "cuda",
            bucket_window=cfg.data.bucket_window,
        )

        train_model = self.model
        if cfg.train.compile:
            train_model = torch.compile(train_model)
        d = cfg.distributed
        self.comm_timer = distributed.CommTimer(self.device) if info.distributed and d.measure_comm else None
        train_model = distributed.wrap_ddp(
            train_model,
            info,
            bucket_cap_mb=d.bucket_cap_mb,
            gradient_as_bucket_view=d.gradient_as_bucket_view,
            comm_hook=d.comm_hook,
            timer=self.comm_timer,
        )
        self.engine = Engine(
            train_model,
            self.optimizer,
            precision=cfg.train.precision,
            device=self.device,
            grad_clip=cfg.train.grad_clip,
            max_nonfinite_steps=cfg.train.max_nonfinite_steps,
            lr_fn=self._lr,
        )
        self.tokens_seen = 0
        self.elapsed_offset = 0.0
        # Step of the newest checkpoint written or resumed from; the same on every rank by
        # construction (unlike a directory listing, which a lagging network filesystem may not
        # have updated on every node yet), so the final "save unless already saved" is collective.
        self.saved_step: int | None = None
        if self.resume_state is not None:
            self._restore()
            self.saved_step = self.engine.step

    def _auto_micro_batch(self) -> int:
        """train.micro_batch_size = "auto": the largest micro batch that fits this device (probed
        with real steps on CUDA, estimated from free RAM elsewhere), the smallest over all ranks,
        rounded down to a divisor of the per-device batch so the global batch stays exact."""
        from bertgpu.train import autobatch, distributed

        t = self.cfg.train
        found = autobatch.find_pretrain_micro_batch(
            self.bert_config,
            seq_len=self.shards.seq_len,
            device=self.device,
            dtype=t.precision,
            with_nsp=self.with_nsp,
            grad_ckpt=t.gradient_checkpointing,
            compile=t.compile,
            max_batch=max(t.global_batch_size // self.world, 1),
        )
        found = int(-distributed.all_reduce_max(-float(found)))
        micro, _ = autobatch.resolve_auto_batch(t.global_batch_size, self.world, found)
        if distributed.is_main():
            print(f"micro_batch_size auto: {found} fits, using {micro}", flush=True)
        return micro

    # -- schedule -------------------------------------------------------------------------------
    def _progress(self) -> float:
        """Training progress in [0, 1] at the step about to be taken."""
        if self.budget is not None:
            return self.budget.progress()
        return min((self.engine.step + 1) / self.max_steps, 1.0)

    def _lr(self) -> float:
        from bertgpu.train.schedule import lr_factor

        s = self.cfg.schedule
        return self.peak_lr * lr_factor(self._progress(), self.warmup, s.decay, s.min_lr_ratio, s.power)

    # -- loss ------------------------------------------------------------------------------------
    def _loss_fn(self, model: Any, batch: dict[str, Any]) -> dict[str, Any]:
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            labels=batch["labels"],
            next_sentence_label=batch.get("next_sentence_label") if self.with_nsp else None,
        )
        terms = {"mlm": out.mlm_loss_sum, "_mlm_correct": out.mlm_correct}
        if self.with_nsp:
            terms["nsp"] = out.nsp_loss_sum
            terms["_nsp_correct"] = out.nsp_correct
        return terms

    def _count_fn(self, batch: dict[str, Any]) -> dict[str, int]:
        # "tokens" (real, non-pad) has no loss term: the engine only sums it over micro-batches
        # and ranks, in the same all-reduce as the loss normalisers, for tokens/s and MFU.
        counts = {"mlm": int((batch["labels"] != -100).sum()), "tokens": int(batch["attention_mask"].sum())}
        if self.with_nsp:
            counts["nsp"] = int(batch["input_ids"].shape[0])
        return counts

    # -- state -----------------------------------------------------------------------------------
    def _agreed_checkpoint(self) -> Path | None:
        """The checkpoint to resume from, the same on every rank: rank 0 lists the run folder and
        broadcasts the step; the others open that step's folder (or fail clearly)."""
        from bertgpu.train import distributed
        from bertgpu.train.checkpoint import (
            COMPLETE,
            checkpoint_dir,
            latest_checkpoint,
            list_checkpoints,
        )

        if self.info.world_size == 1:
            return latest_checkpoint(self.run_dir)
        mine = -1
        if distributed.is_main():
            found = list_checkpoints(self.run_dir)
            mine = found[-1][0] if found else -1
        step = int(distributed.broadcast_scalar(float(mine)))
        if step < 0:
            return None
        path = checkpoint_dir(self.run_dir, step)
        if not (path / COMPLETE).is_file():
            raise BertgpuError(
                f"{path}: rank {self.info.rank} cannot see the checkpoint rank 0 resumes from; "
                f"expected --out on a filesystem shared by every node"
            )
        return path

    def _restore(self) -> None:
        import torch

        from bertgpu.train import distributed
        from bertgpu.train.checkpoint import set_rng_state

        st = self.resume_state
        assert st is not None and self.resume_model is not None
        missing, unexpected = self.model.load_state_dict(self.resume_model, strict=False)
        if unexpected or [k for k in missing if "decoder" not in k]:
            raise BertgpuError(
                f"{self.latest}: checkpoint does not match the configured model "
                f"(missing {missing[:5]}, unexpected {unexpected[:5]}); was [model] changed?"
            )
        self.model.tie_weights()
        self.optimizer.load_state_dict(st["optimizer"])
        self.engine.load_state_dict(st["engine"])
        self.loader.load_state_dict(st["loader"])
        self.tokens_seen = int(st.get("tokens_seen", 0))
        self.elapsed_offset = float(st.get("elapsed_s", 0.0))
        if self.budget is not None and st.get("budget"):
            self.budget.load_state_dict(st["budget"])
        rngs = st.get("rng") or []
        if len(rngs) == self.world:
            set_rng_state(rngs[self.info.rank])
        else:
            # Another world size: the data order and masks continue exactly (they depend on the
            # global position only); dropout noise restarts from (seed, rank, step).
            torch.manual_seed(self.cfg.seed * 1000003 + self.info.rank + 7919 * self.engine.step)
        if distributed.is_main():
            print(f"resumed from {self.latest} (step {self.engine.step}, "
                  f"{self.tokens_seen:,} tokens seen)", flush=True)

    def _gather_rng(self) -> list[Any]:
        from bertgpu.train import distributed
        from bertgpu.train.checkpoint import rng_state

        mine = rng_state()
        if self.world == 1:
            return [mine]
        import torch.distributed as dist

        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, mine)
        return everyone if distributed.is_main() else []

    def _save(self, logger: Any) -> Path | None:
        from bertgpu.models.hf_io import hf_config
        from bertgpu.train import distributed, overrides
        from bertgpu.train.checkpoint import save_checkpoint

        rngs = self._gather_rng()  # collective: every rank takes part
        path = None
        if distributed.is_main():
            train_state = {
                "step": self.engine.step,
                "engine": self.engine.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "loader": self.loader.state_dict(),
                "rng": rngs,
                "tokens_seen": self.tokens_seen,
                "elapsed_s": logger.elapsed_s,
                "budget": self.budget.state_dict() if self.budget is not None else None,
                "world_size": self.world,
                "tokenizer_hash": self.shards.tokenizer_hash,
            }
            extra = {
                "config.toml": overrides.dump_toml(self.cfg),
                "config.json": json.dumps(hf_config(self.model), indent=2, sort_keys=True) + "\n",
            }
            path = save_checkpoint(
                self.run_dir,
                self.engine.step,
                self.model.state_dict(),
                train_state,
                extra_files=extra,
                keep_last=self.cfg.checkpoint.keep_last,
            )
        distributed.barrier()
        self.saved_step = self.engine.step
        return path

    # -- evaluation ------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """MLM loss/accuracy (and NSP accuracy) on the held-out split, all ranks together."""
        import torch

        from bertgpu.data import loaders
        from bertgpu.train import distributed

        if self.val is None:
            return {}
        limit = self.cfg.train.eval_batches or None
        sums = torch.zeros(5, dtype=torch.float64)  # mlm_loss, mlm_n, mlm_correct, nsp_correct, nsp_n
        self.model.eval()
        with torch.no_grad():
            for batch in loaders.iter_eval_batches(
                self.val,
                self.masking,
                self.loader.micro_batch_size,
                seed=self.cfg.seed,
                max_batches=limit,
                rank=self.info.rank,
                world_size=self.world,
            ):
                batch = {k: v.to(self.device) for k, v in batch.items()}
                with self.engine.autocast():
                    out = self.model(
                        input_ids=batch["input_ids"],
                        attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"],
                        labels=batch["labels"],
                        next_sentence_label=batch.get("next_sentence_label") if self.with_nsp else None,
                    )
                sums[0] += float(out.mlm_loss_sum)
                sums[1] += float(out.mlm_count)
                sums[2] += float(out.mlm_correct)
                if self.with_nsp:
                    sums[3] += float(out.nsp_correct)
                    sums[4] += float(out.nsp_count)
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

    # -- start-up summary ------------------------------------------------------------------------
    def _startup_rows(self) -> list[tuple[str, str]]:
        from bertgpu.models.bert import num_parameters

        cfg = self.cfg
        seq = self.shards.seq_len
        rows = [
            ("run folder", str(self.run_dir)),
            ("data", f"{self.data_dir} ({len(self.shards):,} sequences x {seq} tokens, {self.shards.objective})"),
            ("model", f"{num_parameters(self.model) / 1e6:.1f} M parameters "
                      f"(L={self.bert_config.num_hidden_layers}, H={self.bert_config.hidden_size}, "
                      f"A={self.bert_config.num_attention_heads}, V={self.bert_config.vocab_size})"),
            ("device", f"{self.device} x {self.world} ({cfg.train.precision})"),
            ("micro batch per device", str(self.loader.micro_batch_size)),
            ("accumulation steps", str(self.accumulation)),
            ("batch per device per step", str(self.loader.micro_batch_size * self.accumulation)),
            ("devices", str(self.world)),
            ("global batch (sequences/step)", str(cfg.train.global_batch_size)),
            ("tokens per step", f"{cfg.train.global_batch_size * seq:,}"),
            ("learning rate", f"{self.peak_lr:.3g} ({cfg.optim.name}, lr_scaling {cfg.optim.lr_scaling}, "
                              f"warm-up {self.warmup:.1%}, {cfg.schedule.decay} decay)"),
        ]
        if self.budget is not None:
            rows.append(("budget", f"{cfg.train.budget_hours:g} h (max_steps {self.max_steps or 'none'})"))
        else:
            rows.append(("steps", f"{self.max_steps:,}"))
        if self.world > 1:
            d = cfg.distributed
            rows.append(("gradient all-reduce", f"{self.info.backend}, once per step, buckets {d.bucket_cap_mb} MB, "
                                                 f"comm hook {d.comm_hook}"))
        if self.engine.step:
            rows.append(("resumed at step", str(self.engine.step)))
        return rows

    def _mfu_fn(self) -> Any:
        from bertgpu.train import flops

        fpt = flops.flops_per_token_from_config(
            self.bert_config, self.shards.seq_len, mlm_fraction=self.cfg.data.mask_rate, with_nsp=self.with_nsp
        )
        peak = None
        if self.device.type == "cuda":
            import torch

            dtype = {"bf16": "bf16", "fp16": "fp16", "fp32": "tf32"}[self.cfg.train.precision]
            peak = flops.peak_tflops(torch.cuda.get_device_name(self.device), dtype)

        def fn(tokens_per_s: float) -> float | None:
            return flops.mfu(tokens_per_s, fpt, peak, n_devices=self.world) if peak else None

        return fn

    # -- the loop --------------------------------------------------------------------------------
    def fit(self) -> RunResult:
        from bertgpu.models.hf_io import save_pretrained
        from bertgpu.train import distributed, metrics, overrides

        cfg = self.cfg
        is_main = distributed.is_main()
        if is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.toml").write_text(overrides.dump_toml(cfg), encoding="utf-8")
            tok_dst = self.run_dir / "tokenizer"
            if not tok_dst.exists():
                import shutil

                shutil.copytree(self.shards.tokenizer_dir, tok_dst)
            print(metrics.format_startup_table(self._startup_rows(), title="bertgpu pretrain"), flush=True)
        logger = metrics.MetricsLogger(
            self.run_dir if is_main else None,
            is_main,
            total_steps=self.max_steps or None,
            log_every=cfg.train.log_every_steps,
            initial_step=self.engine.step,
            elapsed_offset_s=self.elapsed_offset,
        )
        mfu_fn = self._mfu_fn()
        throughput = metrics.Throughput(n_devices=self.world)
        preempt = _Preemption()
        preempt.install()
        last_eval: dict[str, float] = {}
        last_ckpt_time = time.monotonic()
        preempted = False
        if self.budget is not None:
            self.budget.start()
        throughput.reset()
        # Per log window, on this rank: loop time (data + step), time waiting for data, exposed
        # all-reduce time. Their ratios are the shares in the log line; evaluation and
        # checkpoint writes fall outside the window on purpose.
        window_s = data_wait = comm_wait = 0.0
        stop_reason = "max_steps"
        try:
            while True:
                if self.max_steps and self.engine.step >= self.max_steps:
                    break
                if self.budget is not None and self.budget.expired():
                    logger.print(f"budget of {cfg.train.budget_hours:g} h reached at step {self.engine.step}")
                    stop_reason = "budget"
                    break
                # One small collective per step: a preemption on any rank stops every rank here.
                if distributed.any_true(preempt.requested):
                    preempted = True
                    stop_reason = "preempted"
                    break
                t0 = time.perf_counter()
                micro_batches = self.loader.next_step()
                t1 = time.perf_counter()
                res = self.engine.train_step(micro_batches, self._loss_fn, self._count_fn)
                data_wait += t1 - t0
                window_s += time.perf_counter() - t0
                if self.comm_timer is not None:
                    comm_wait += self.comm_timer.pop_step()
                step = self.engine.step
                step_tokens = res.counts["tokens"]  # real tokens of the whole step, all ranks
                self.tokens_seen += step_tokens
                throughput.update(tokens=step_tokens, sequences=cfg.train.global_batch_size)

                if step % cfg.train.log_every_steps == 0 or step == self.max_steps:
                    rates = throughput.rates()
                    scalars: dict[str, Any] = {
                        "loss": res.loss,
                        "mlm_loss": res.losses.get("mlm"),
                        "mlm_acc": res.extras.get("_mlm_correct", 0.0) / max(res.counts.get("mlm", 0), 1),
                        "lr": res.lr,
                        "grad_norm": res.grad_norm,
                        **rates,
                        "mfu": mfu_fn(rates.get("tokens_per_s", 0.0)),
                        "data_wait_share": data_wait / max(window_s, 1e-9),
                        "comm_share": comm_wait / max(window_s, 1e-9) if self.comm_timer is not None else None,
                        "tokens_seen": self.tokens_seen,
                        "epoch": self.loader.epoch,
                        "skipped_steps": self.engine.skipped_steps,
                        **metrics.device_memory(self.device),
                        **metrics.gpu_utilisation(self.device),
                    }
                    if self.with_nsp:
                        scalars["nsp_loss"] = res.losses.get("nsp")
                        scalars["nsp_acc"] = res.extras.get("_nsp_correct", 0.0) / max(res.counts.get("nsp", 0), 1)
                    logger.log(step, "train", **scalars)
                    window_s = data_wait = comm_wait = 0.0
                if res.skipped:
                    logger.print(f"step {step}: non-finite loss or gradients, update skipped "
                                 f"({self.engine.nonfinite_in_row} in a row)")

                if cfg.train.eval_every_steps and step % cfg.train.eval_every_steps == 0:
                    last_eval = self.evaluate()
                    if last_eval:
                        logger.log(step, "eval", **last_eval)
                    throughput.reset()
                every = cfg.checkpoint.every_steps
                by_time = (
                    cfg.checkpoint.every_minutes is not None
                    and distributed.broadcast_scalar(time.monotonic() - last_ckpt_time) >= cfg.checkpoint.every_minutes * 60
                )
                if (every and step % every == 0) or by_time:
                    self._save(logger)
                    last_ckpt_time = time.monotonic()
                    throughput.reset()

            # End of training (steps, budget, or preemption): a checkpoint to resume from.
            step = self.engine.step
            if preempted:
                logger.print(f"preempted at step {step}: writing a checkpoint and stopping")
            elif not cfg.train.eval_every_steps or step % cfg.train.eval_every_steps != 0:
                last_eval = self.evaluate()
                if last_eval:
                    logger.log(step, "eval", **last_eval)
            # Ranks agree on the step by construction; check it once (cheap) rather than trust it.
            lo, hi = -distributed.all_reduce_max(-step), distributed.all_reduce_max(step)
            if lo != hi:
                raise BertgpuError(f"ranks stopped at different steps ({lo}..{hi}); please report this bug")
            logger.log(step, "info", event="end", reason=stop_reason, world_size=self.world,
                       rank_step_min=lo, rank_step_max=hi)
            if self.saved_step != step:
                self._save(logger)
            export_dir = None
            if not preempted and is_main:
                export_dir = save_pretrained(self.model, self.run_dir / "hf", tokenizer=self.run_dir / "tokenizer")
                logger.print(f"done: step {step}, {self.tokens_seen:,} tokens; Hugging Face export in {export_dir}")
            distributed.barrier()
        finally:
            preempt.restore()
            logger.close()
            self.loader.close()
        return RunResult(self.run_dir, self.engine.step, export_dir, preempted, last_eval)


if __name__ == "__main__":  # pragma: no cover
    from bertgpu.cli import main as cli_main

    sys.exit(cli_main(["pretrain", *sys.argv[1:]]))
