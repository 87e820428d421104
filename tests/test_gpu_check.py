"""`make gpu-check` is run on a lent GPU with no chance to fix a typo: its stages are checked
here, on the CPU (the commands parse, the extra stages run only when named), and the profiler
script's tables add up."""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import traceback
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("smoke", [True, False])
def test_every_stage_command_parses(tmp_path, smoke):
    """Each `bench model` stage's arguments parse with bench's own parser, each pretraining
    stage's overrides load as a config, and the extra stages are marked extra."""
    pytest.importorskip("transformers")
    from bertgpu.bench import model as bench_model
    from bertgpu.config.schema import load_config

    gpu_check = load("gpu_check")
    stages = gpu_check.stages(smoke, tmp_path)
    names = [s["name"] for s in stages]
    assert len(set(names)) == len(names)
    assert [s["name"] for s in stages if s.get("extra")] == [
        "profile", "profile philox dropout", "profile pointwise autotune", "profile modernbert",
        "compile modes", "hf compiled", "dropout off", "modernbert compiled",
        "unpadded compiled", "bert-large compiled", "saved bytes", "attention kernels",
        "optimizer step", "pretrain bert-base adamw", "pretrain syncs", "pretrain cuda graphs"]
    for stage in stages:
        cmd = stage["cmd"]
        if cmd[1] == "benchmarks/step_syncs.py":  # a bertgpu command after its own options
            assert (ROOT / cmd[1]).exists()
            cmd = [cmd[0], "-m", "bertgpu", *cmd[cmd.index("--") + 1:]]
        if cmd[1:4] == ["-m", "bertgpu", "bench"]:
            parser = argparse.ArgumentParser()
            bench_model.add_arguments(parser)
            parser.parse_args(cmd[5:])
        elif cmd[1:4] == ["-m", "bertgpu", "pretrain"]:
            overrides = list(cmd[5:])
            i = overrides.index("--data")
            del overrides[i:i + 2]
            i = overrides.index("--out")
            del overrides[i:i + 2]
            cfg = load_config(ROOT / cmd[4], overrides)
            if stage["name"] == "pretrain cuda graphs":
                assert cfg.impl.compile_mode == "reduce-overhead"
            if cmd[4] == "configs/bert-base.toml":  # LAMB, but where a stage says otherwise
                assert cfg.optim.name == ("adamw" if stage["name"].endswith("adamw") else "lamb")
        elif cmd[1:3] == ["-m", "pytest"]:
            assert all((ROOT / a).exists() for a in cmd if a.startswith("tests/")), cmd
        else:
            assert (ROOT / cmd[1]).exists(), cmd


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_profile_tables_add_up(tmp_path, arch):
    """benchmarks/gpu_profile.py on a tiny model on the CPU: every family's share and the
    per-step times are the kernel table's, and the matrix products are found."""
    gpu_profile = load("gpu_profile")
    assert gpu_profile.main(["--arch", arch, "--size", "tiny", "--device", "cpu",
                             "--compile-backend", "eager", "--warmup", "1", "--steps", "2",
                             "--out", str(tmp_path)]) == 0
    text = (tmp_path / "profile.md").read_text()
    assert text.startswith("# ModernBERT-tiny 4 x 32 unpadded" if arch == "modernbert"
                           else "# BERT-tiny 4 x 32 full")
    families = dict(re.findall(r"^\| ([a-z][^|`]*?) \| [\d.]+ \| ([\d.]+)% \|$", text, re.M))
    assert "matrix products" in families and "optimizer" in families
    assert sum(float(v) for v in families.values()) == pytest.approx(100, abs=0.1 * len(families))
    assert gpu_profile.family("sm90_xmma_gemm_bf16bf16_bf16f32") == "matrix products"
    assert gpu_profile.family("triton_per_fused__log_softmax_1") == "loss (cross-entropy)"
    assert gpu_profile.family("triton_poi_fused_add_native_dropout_3") == "compiled fused kernels"
    assert gpu_profile.family("pytorch_flash::flash_fwd_kernel") == "attention"
    assert gpu_profile.family("Optimizer.step#LAMB.step") == "optimizer"
    randint = ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_"
               "kernel<unsigned int, 4, ...::{lambda(...)#1}>")
    assert gpu_profile.family(randint) == "other"
    assert gpu_profile.family("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<"
                              "Flash_bwd_kernel_traits<64, 128, 128, 8, 4, 4, 4, false, false, "
                              "cutlass::bfloat16_t, ...>") == "attention"


def test_attention_kernels_run_and_print_their_table(capsys):
    """The attention kernel script, in --smoke on the CPU: each row of its table is printed (a
    refusing backend says why; the cuDNN rows come back from their child process)."""
    assert load("attention_kernels").main(["--smoke", "--iters", "1", "--warmup", "0"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 2 x 16")]
    assert [r.split(" | ")[2] for r in rows] == [
        "ours (segments)", "flash varlen (B rows)", "cudnn varlen (segments)",
        "cudnn varlen (B rows)", "sdpa flash", "sdpa cudnn", "sdpa efficient", "sdpa math"]
    assert "refused: " in rows[0] and re.search(r"\| [\d.]+ \| \d+ \| +\|$", rows[-1])
    assert all("refused: needs CUDA" in r for r in rows[2:4]), rows[2:4]


def test_profile_counts_device_time_once():
    """On CUDA a step's time is its kernels' time: a host operator (aten::mm) carries its kernel's
    device time as its own "self device time", and a compiled Triton kernel's launcher has the
    kernel's name, so counting every event doubled most of the step (an H200 profile said 94 ms
    of device time in a 48 ms step). A record_function range on the device's timeline is not
    work either: the optimizer's was counted beside its own kernel."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    gpu_profile = load("gpu_profile")

    def event(key, device_type, us, annotation=False):
        return SimpleNamespace(key=key, device_type=device_type, self_device_time_total=us,
                               count=1, self_cpu_time_total=1.0, is_user_annotation=annotation)

    events = [event("aten::mm", DeviceType.CPU, 300.0),
              event("nvjet_sm90_tst_256x128", DeviceType.CUDA, 300.0),
              event("triton_poi_fused_gelu_0", DeviceType.CPU, 50.0),  # its launcher
              event("triton_poi_fused_gelu_0", DeviceType.CUDA, 50.0),
              # the optimizer's record_function range, drawn on the device over its kernel
              event("Optimizer.step#AdamW.step", DeviceType.CUDA, 20.0, annotation=True),
              event("multi_tensor_apply_kernel", DeviceType.CUDA, 20.0)]
    assert gpu_profile.kernel_times(events, cuda=True) == {"nvjet_sm90_tst_256x128": 300.0,
                                                           "triton_poi_fused_gelu_0": 50.0,
                                                           "multi_tensor_apply_kernel": 20.0}
    assert gpu_profile.kernel_counts(events, True) == {"nvjet_sm90_tst_256x128": 1,
                                                       "triton_poi_fused_gelu_0": 1,
                                                       "multi_tensor_apply_kernel": 1}
    assert gpu_profile.kernel_times(events, cuda=False)["aten::mm"] == 1.0  # the CPU's own time


def test_bench_table_is_the_last_table_of_the_log(tmp_path):
    """A bench stage's table comes back in the printed output (a short lease reads that, not the
    files): the caption and rows of the last table, not an earlier one or the lines after it."""
    gpu_check = load("gpu_check")
    log = tmp_path / "bench.log"
    log.write_text("$ bench\n| a | b |\n|---|---|\n| 1 | 2 |\nwarmup...\n"
                   "cuda | torch 2.11 | bf16\n| model | tokens/s |\n|---|---|\n| ours | 9 |\n"
                   "appended 1 rows to x.jsonl\n")
    assert gpu_check.bench_table(log) == (
        "cuda | torch 2.11 | bf16\n| model | tokens/s |\n|---|---|\n| ours | 9 |")
    assert gpu_check.bench_table(tmp_path / "missing.log") == ""


def test_run_numbers_read_the_metrics_and_count_recompiles_and_recordings(tmp_path):
    """A pretraining stage's line: first and last interval, MFU, compile seconds (the largest
    logged), the recompiles and the CUDA graph recordings its log shows."""
    gpu_check = load("gpu_check")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"kind": "train", "tokens_per_s": 1000.0, "mfu": 0.25, "compile_s": 30.5}\n'
        '{"kind": "eval", "val_mlm_loss": 3.0}\nnot json\n'
        '{"kind": "train", "tokens_per_s": 2000.0, "mfu": 0.5, "compile_s": 0.0}\n')
    log = tmp_path / "stage.log"
    log.write_text("Recompiling function forward\n" + "[0/0] Recording function=f, mode=FWD\n"
                   "[0/0] Recording function=f, mode=BWD\n")
    assert gpu_check.run_numbers(run, log) == (
        "first interval 1,000 tok/s, last 2,000 tok/s, MFU 50.0%, compile 30.5 s, recompiles 1, "
        "CUDA graph recordings 2")
    log.write_text("")
    assert gpu_check.run_numbers(run, log).endswith("recompiles 0")
    assert gpu_check.run_numbers(tmp_path / "none", log) == "no training record; recompiles 0"


def test_profile_memory_traffic_joins_inductor_bytes_with_kernel_times():
    """The compiled kernels' traffic: each kernel's bytes per launch (inductor's estimate, found
    on the live autotuners; a name shared by two graphs' kernels takes their mean) times its
    launches, over its device time; the total rate against the device's HBM peak."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    gpu_profile = load("gpu_profile")
    kernels = []
    for name, gb in (("triton_per_fused_layer_norm_0", 0.004), ("triton_poi_fused_gelu_1", 0.002),
                     ("triton_poi_fused_gelu_1", 0.006)):
        k = object.__new__(CachingAutotuner)  # what inductor leaves in the process, bare
        k.inductor_meta = {"kernel_name": name, "kernel_num_gb": gb}
        kernels.append(k)
    found = gpu_profile.triton_kernel_bytes()
    assert found["triton_per_fused_layer_norm_0"] == [4e6]
    assert sorted(found["triton_poi_fused_gelu_1"]) == [2e6, 6e6]
    # 2 steps: the norm ran 24 times in 40 us (2.4 TB/s), the GELU 12 times in 16 us (3 TB/s)
    times = {"triton_per_fused_layer_norm_0": 40.0, "triton_poi_fused_gelu_1": 16.0,
             "triton_poi_fused_other_2": 10.0, "sm90_xmma_gemm": 100.0}
    counts = {"triton_per_fused_layer_norm_0": 24, "triton_poi_fused_gelu_1": 12,
              "triton_poi_fused_other_2": 2, "sm90_xmma_gemm": 10}
    moved = gpu_profile.traffic(times, counts, found)
    assert moved["triton_per_fused_layer_norm_0"] == (24 * 4e6, 40.0)
    assert moved["triton_poi_fused_gelu_1"] == (12 * 4e6, 16.0)
    lines = gpu_profile.traffic_lines(moved, times, 2, 3.35)
    text = "\n".join(lines)
    assert ("2 of 3 Triton kernels have inductor's byte estimate: 0.07 GB per step in 0.03 ms, "
            "2.57 TB/s (77% of the device's 3.35 TB/s)") in text
    assert "| `triton_per_fused_layer_norm_0` | 0.020 | 0.048 | 2.40 |" in text
    assert "| `triton_poi_fused_gelu_1` | 0.008 | 0.024 | 3.00 |" in text
    assert gpu_profile.traffic_lines({}, times, 2, 3.35) == []
    del kernels


def test_profile_keeps_the_sources_of_the_slowest_compiled_kernels():
    """kernels.py: the Triton source of the compiled kernels with the most device time, slowest
    first, each under its time and traffic per step; kernels without a source (cuBLAS) are not
    listed, and `top` caps the count."""
    from types import SimpleNamespace

    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    gpu_profile = load("gpu_profile")
    kernels = []
    for name in ("triton_per_fused_layer_norm_0", "triton_poi_fused_gelu_1", "triton_poi_x_2"):
        k = object.__new__(CachingAutotuner)
        k.inductor_meta = {"kernel_name": name}
        k.fn = SimpleNamespace(src=f"@triton.jit\ndef {name}(in_ptr0, out_ptr0):\n    pass\n")
        kernels.append(k)
    sources = gpu_profile.triton_kernel_sources()
    assert sources["triton_poi_fused_gelu_1"].startswith("@triton.jit\ndef triton_poi_fused_gel")
    times = {"triton_per_fused_layer_norm_0": 40.0, "triton_poi_fused_gelu_1": 160.0,
             "triton_poi_x_2": 1.0, "sm90_xmma_gemm": 1000.0}
    moved = {"triton_poi_fused_gelu_1": (12 * 4e6, 160.0)}
    text = gpu_profile.kernel_sources_text(times, sources, 2, moved, top=2)
    assert text.index("def triton_poi_fused_gelu_1(") < text.index("def triton_per_fused_layer_n")
    assert ("# triton_poi_fused_gelu_1: 0.080 ms per step, 0.024 GB per step, 0.30 TB/s\n"
            "@triton.jit") in text
    assert "# triton_per_fused_layer_norm_0: 0.020 ms per step\n" in text
    assert "triton_poi_x_2" not in text and "xmma" not in text
    del kernels
    # graph_N.py: the generated code of each compiled graph, forward and backward
    torch._dynamo.reset()
    x = torch.randn(8, requires_grad=True)
    torch.compile(lambda t: torch.nn.functional.gelu(t) * 3.5)(x).sum().backward()
    files = gpu_profile.compiled_graph_files()
    assert len(files) >= 2 and all("def call(" in f.read_text() for f in files)
    assert sum("3.5" in f.read_text() for f in files) >= 2  # the constant, forward and backward


def test_only_runs_the_named_stages_in_their_order_and_refuses_a_misspelt_one(tmp_path):
    gpu_check = load("gpu_check")
    stages = gpu_check.stages(True, tmp_path)
    order = ["compile modes", "pytest -m gpu", "profile"]
    assert [s["name"] for s in gpu_check.select(stages, order)] == order
    assert not any(s.get("extra") for s in gpu_check.select(stages, None))
    with pytest.raises(SystemExit, match="no stage 'autotun'; the stages are 'pytest -m gpu'"):
        gpu_check.select(stages, ["profile", "autotun"])


def test_budget_skips_a_stage_whose_limit_no_longer_fits(tmp_path, monkeypatch, capsys):
    """--budget-s: a stage starts only when its whole limit fits what is left; a later, shorter
    one still runs; skipped stages are listed, not failures."""
    gpu_check = load("gpu_check")
    ran = []

    def fake_run(stage, out):
        ran.append(stage["name"])
        return dict(name=stage["name"], rc=0, seconds=0.0, log=out / "x.log", run=None)

    monkeypatch.setattr(gpu_check, "run_stage", fake_run)
    monkeypatch.setenv("GPU_CHECK_OUT", str(tmp_path))
    # smoke limits: profile 120 s, checkpoint stall 60 s, unpadded compiled 120 s
    assert gpu_check.main(["--smoke", "--only", "profile", "checkpoint stall",
                           "unpadded compiled", "--budget-s", "100"]) == 0
    assert ran == ["checkpoint stall"]
    summary = (tmp_path / "summary.md").read_text()
    assert re.search(r"\| profile \| skipped \| 0.0 \| its 120 s limit did not fit the \d+ s left",
                     summary)
    assert "| checkpoint stall | 0 |" in summary
    assert "| unpadded compiled | skipped |" in summary


def test_saved_bytes_stage_puts_its_audit_lines_in_the_summary(tmp_path, monkeypatch):
    """A short lease reads the summary: the `saved bytes` stage's audit rows go into it."""
    gpu_check = load("gpu_check")

    def fake_run(stage, out):
        log = out / "saved.log"
        log.write_text("18/18 configurations compile\n"
                       "bert-base padded     saved for backward: 34.1 x H bytes (bf16 32.0 H)\n"
                       "bert-base unpadded   saved for backward: 33.9 x H bytes (bf16 31.9 H)\n")
        return dict(name=stage["name"], rc=0, seconds=1.0, log=log, run=None)

    monkeypatch.setattr(gpu_check, "run_stage", fake_run)
    monkeypatch.setenv("GPU_CHECK_OUT", str(tmp_path))
    assert gpu_check.main(["--smoke", "--only", "saved bytes"]) == 0
    assert ("| saved bytes | 0 | 1.0 | bert-base padded saved for backward: 34.1 x H bytes "
            "(bf16 32.0 H); bert-base unpadded saved for backward: 33.9 x H bytes (bf16 31.9 H) |"
            ) in (tmp_path / "summary.md").read_text()


def test_step_syncs_counts_the_sync_warnings_of_each_step(tmp_path, monkeypatch, capsys,
                                                         one_thread):
    """benchmarks/step_syncs.py on the CPU, torch's CUDA sync warning stood in for by the same
    warning raised where the engine reads a step's numbers (a wait for the device on CUDA):
    each step from --from on counts, with the engine's frame; the CLI's one-line warnings do
    not take them first."""
    import warnings

    from _shards import write_synthetic_shards
    from _tiny import TINY

    from bertgpu.train import readback

    step_syncs = load("step_syncs")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    read = readback.PendingStep.read

    def waits(self):
        warnings.warn("called a synchronizing CUDA operation", stacklevel=2)
        return read(self)

    monkeypatch.setattr(readback.PendingStep, "read", waits)
    data = write_synthetic_shards(tmp_path / "data", n_train=16, n_val=4, seq_len=16,
                                  vocab_size=TINY["vocab_size"])
    rc = step_syncs.main(["--from", "3", "--", "pretrain", str(ROOT / "configs/tiny.toml"),
                          "--data", str(data), "--out", str(tmp_path / "run"),
                          "--train.max_steps", "5", "--train.global_batch_size", "4",
                          "--impl.micro_batch_size", "4", "--impl.num_workers", "0",
                          "--train.eval_every_steps", "0", "--impl.device", "cpu",
                          "--model.vocab_size",
                          str(TINY["vocab_size"])])
    out = capsys.readouterr().out
    assert rc == 0 and modes == ["warn", "default"]
    summary = out[out.index("step_syncs: steps 3-5:"):].splitlines()
    assert summary[0].startswith("step_syncs: steps 3-5: ")
    assert "in 3 of 3 steps (steps 3, 4, 5)" in summary[0]
    assert summary[1].split()[-1].startswith("bertgpu/train/engine.py:")
    # the same command again with more steps resumes at 5: it counts from its own first step
    modes.clear()
    rc = step_syncs.main(["--from", "3", "--", "pretrain", str(ROOT / "configs/tiny.toml"),
                          "--data", str(data), "--out", str(tmp_path / "run"),
                          "--train.max_steps", "7", "--train.global_batch_size", "4",
                          "--impl.micro_batch_size", "4", "--impl.num_workers", "0",
                          "--train.eval_every_steps", "0", "--impl.device", "cpu",
                          "--model.vocab_size", str(TINY["vocab_size"])])
    out = capsys.readouterr().out
    assert rc == 0 and modes == ["warn", "default"]
    assert "steps 6-7: " in out and "in 2 of 2 steps (steps 6, 7)" in out


def test_step_syncs_names_the_package_frame_not_a_venv_beside_it(tmp_path):
    step_syncs = load("step_syncs")
    package = tmp_path / "bertgpu" / "src" / "bertgpu"
    venv_torch = tmp_path / "bertgpu" / ".venv" / "lib" / "torch" / "nn" / "clip_grad.py"
    stack = [traceback.FrameSummary(str(package / "train" / "engine.py"), 398, "f"),
             traceback.FrameSummary(str(venv_torch), 90, "g")]
    assert step_syncs.first_own_frame(stack, package) == "bertgpu/train/engine.py:398"
