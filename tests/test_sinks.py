"""Tests for bertgpu.telemetry.sinks: the [logging] section, the fan-out thread (order, a failing
sink), W&B in offline mode read back from its run file, MLflow's file store read back through
MLflow's own client, resuming into the same runs, and the one-line error when a package is
missing."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
import time
from pathlib import Path

import pytest

from bertgpu.config.sections import LoggingSection
from bertgpu.errors import BertgpuError
from bertgpu.telemetry.metrics import MetricsLogger
from bertgpu.telemetry.records import read_jsonl, read_metrics
from bertgpu.telemetry.run_logger import open_logger
from bertgpu.telemetry.sinks import flatten_config
from bertgpu.testing.nvml_sim import SimGpu, SimulatedNvml

CONFIG = {"seed": 3, "model": {"hidden_size": 32, "num_hidden_layers": 2},
          "train": {"max_steps": 4, "precision": "fp32"}}


class Recorder:
    """A sink that keeps every call."""

    name = "recorder"

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail_on = fail_on

    def log(self, step, kind, scalars):
        if kind == self.fail_on:
            raise RuntimeError("tracking server went away")
        self.calls.append(("log", step, kind, dict(scalars)))

    def log_config(self, config):
        self.calls.append(("config", config))

    def close(self):
        self.calls.append(("close",))


def _run(logger: MetricsLogger, steps: int = 4) -> None:
    for step in range(1, steps + 1):
        logger.log(step, "train", loss=4.0 / step, lr=1e-3 * step, tokens_per_s=1000.0,
                   note="text is not a metric", rank_compute_s=[0.5, 0.75])
    logger.log(steps, "eval", val_mlm_loss=1.5, val_mlm_acc=0.25)
    logger.close()


def test_logging_section_fields_and_validation():
    for f in dataclasses.fields(LoggingSection):
        assert f.metadata.get("help"), f.name  # --help-config prints every field's help
    cfg = LoggingSection()
    assert (cfg.wandb, cfg.mlflow, cfg.tensorboard, cfg.gpu_monitor_interval_s) == \
        (False, False, None, 5.0)
    cfg.validate()
    with pytest.raises(BertgpuError, match=r"logging.wandb_mode: found 'cloud'"):
        LoggingSection(wandb_mode="cloud").validate()
    with pytest.raises(BertgpuError, match=r"gpu_monitor_interval_s: found 0.01"):
        LoggingSection(gpu_monitor_interval_s=0.01).validate()
    assert flatten_config(CONFIG)["model.hidden_size"] == 32


def test_logging_section_in_a_config_schema(tmp_path):
    from bertgpu.config import overrides, render

    @dataclasses.dataclass
    class Schema:  # as the pretraining and fine-tuning schemas hold it
        logging: LoggingSection = dataclasses.field(default_factory=LoggingSection,
                                                    metadata={"help": "metric sinks"})

    cfg = overrides.apply_dict(Schema(), {"logging": {"wandb": True, "wandb_project": "p"}},
                               "recipe.toml")
    overrides.apply_overrides(cfg, ["--logging.mlflow", "--logging.gpu_monitor_interval_s", "2",
                                    "--logging.wandb_run_name=r1"])
    assert (cfg.logging.wandb, cfg.logging.mlflow, cfg.logging.wandb_project) == (True, True, "p")
    assert cfg.logging.gpu_monitor_interval_s == 2.0 and cfg.logging.wandb_run_name == "r1"
    with pytest.raises(BertgpuError, match="logging.wandb_projet"):
        overrides.apply_dict(Schema(), {"logging": {"wandb_projet": "p"}}, "recipe.toml")
    (tmp_path / "c.toml").write_text(render.dump_toml(cfg), encoding="utf-8")
    again = overrides.apply_dict(Schema(), overrides.read_toml(tmp_path / "c.toml"), "c.toml")
    assert again == cfg  # the resolved config reads back the same (None as "none")
    assert "--logging.wandb_mode" in render.format_help(Schema)


def test_fanout_order_system_metrics_and_a_failing_sink(tmp_path, capsys):
    good, bad = Recorder(), Recorder(fail_on="eval")
    nvml = SimulatedNvml([SimGpu(temp_c=[70.0]), SimGpu(throttle=[0x40])])
    logger = open_logger(tmp_path, True, LoggingSection(tensorboard=False), CONFIG,
                         nvml=nvml, stream=io.StringIO(), log_every=1)
    # open_logger's sinks are W&B and MLflow (off here); add recorders the same way it does.
    logger2 = MetricsLogger(tmp_path / "b", True, total_steps=4, stream=io.StringIO(),
                            sinks=[good, bad], monitor=logger.monitor, tensorboard=False)
    logger2.log_config(CONFIG)
    logger.monitor.sample()
    _run(logger2)
    logger.close()
    assert good.calls[0] == ("config", CONFIG)
    logs = [c for c in good.calls if c[0] == "log"]
    train = [c for c in logs if c[2] == "train"]
    assert [c[1] for c in train] == [1, 2, 3, 4]
    assert train[0][3]["loss"] == 4.0 and train[0][3]["lr"] == 0.001
    assert "note" not in train[0][3] and "elapsed_s" in train[0][3]
    assert train[0][3]["rank_compute_s/1"] == 0.75  # per-rank lists become one key per rank
    assert train[0][3]["gpu_temp_max_c"] == 70.0
    system = [c for c in logs if c[2] == "system"]
    assert system and system[0][3]["gpu0/temp_c"] == 70.0
    assert system[0][3]["gpu1/throttled"] == 1.0 and system[0][3]["gpu0/throttled"] == 0.0
    assert logs[-1][2] == "eval" and good.calls[-1] == ("close",)
    # The failing sink was dropped at its first failure, with one warning, and the run went on.
    assert ("close",) not in bad.calls and all(c[2] != "eval" for c in bad.calls if c[0] == "log")
    err = capsys.readouterr().err
    assert err.count("the recorder sink failed in log") == 1 and "off for the rest" in err
    assert len(read_metrics(tmp_path / "b")) == 5


def test_missing_package_is_a_one_line_error(tmp_path, monkeypatch):
    for module, flag in (("wandb", "wandb"), ("mlflow", "mlflow"), ("tensorboard", "tensorboard")):
        monkeypatch.setitem(sys.modules, module, None)
        with pytest.raises(BertgpuError) as e:
            open_logger(tmp_path / "r", True, LoggingSection(**{flag: True}), CONFIG)
        assert f"logging.{flag} = true but the {module} package is not installed" in str(e.value)
        assert "pip install 'bertgpu[" in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(BertgpuError):  # every rank refuses alike, before any work
            open_logger(None, False, LoggingSection(**{flag: True}), CONFIG)
    assert not (tmp_path / "r").exists()
    # Off (the default), a missing package is not noticed at all.
    logger = open_logger(tmp_path / "r", True, LoggingSection(gpu_monitor_interval_s=0), CONFIG,
                         stream=io.StringIO())
    _run(logger)
    assert logger.sink_names == [] and len(read_metrics(tmp_path / "r")) == 5


def test_non_main_rank_writes_nothing(tmp_path, monkeypatch):
    logger = open_logger(tmp_path / "r", False, LoggingSection(mlflow=True), CONFIG,
                         nvml=SimulatedNvml(2), stream=io.StringIO())
    assert logger.monitor is None and logger.sink_names == []
    _run(logger)
    assert not (tmp_path / "r").exists()
    # Local rank 0 of the second node samples its own node's GPUs, and writes nothing else.
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    logger = open_logger(tmp_path / "r", False, LoggingSection(), CONFIG,
                         nvml=SimulatedNvml(2), stream=io.StringIO())
    _run(logger)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["gpu.node1.jsonl"]
    assert {r["gpu"] for r in read_jsonl(tmp_path / "r" / "gpu.node1.jsonl")} == {0, 1}


# --------------------------------------------------------------------------------------------
# Weights & Biases, offline
# --------------------------------------------------------------------------------------------


def _wandb_records(path: Path) -> list:
    """The records of a W&B run file: a ":W&B" header (7 bytes), then LevelDB-log blocks of
    32 KiB, each record a 7-byte header (crc32, length, type) and a protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if len(chunk) < length:  # still being written
            break
        pending = chunk if kind in (1, 2) else pending + chunk  # full/first vs middle/last
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pending)
            out.append(rec)
    return out


@pytest.fixture()
def wandb_env(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_MODE", "offline")  # belt and braces: never the network
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_wandb_offline_run_holds_the_history(tmp_path, wandb_env, capsys):
    run = tmp_path / "base"
    cfg = LoggingSection(wandb=True, wandb_project="tests", wandb_mode="auto",
                         tensorboard=False)
    nvml = SimulatedNvml([SimGpu(temp_c=[66.0])])
    logger = open_logger(run, True, cfg, CONFIG, nvml=nvml, stream=io.StringIO())
    assert logger.sink_names == ["wandb"]
    logger.monitor.sample()
    _run(logger)
    run_id = json.loads((run / "sinks.json").read_text())["wandb_run_id"]
    (folder,) = (run / "wandb").glob(f"offline-run-*-{run_id}")  # offline: no key, no network
    # W&B's service process writes the run file; finish() may return before the last write.
    deadline = time.monotonic() + 30
    while True:
        records = _wandb_records(folder / f"run-{run_id}.wandb")
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        assert time.monotonic() < deadline, "the W&B run file was never completed"
        time.sleep(0.2)
    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in r.history.item}
            history.setdefault(items.pop("_step"), {}).update(items)  # W&B's step = ours
    assert sorted(history) == [1, 2, 3, 4]
    assert [history[s]["train/loss"] for s in (1, 2, 3, 4)] == [4.0, 2.0, 1.33333, 1.0]  # 6 digits
    assert history[2]["train/lr"] == pytest.approx(0.002)
    assert history[4]["eval/val_mlm_acc"] == 0.25
    assert history[1]["system/gpu0/temp_c"] == 66.0
    config = {}
    for r in records:
        if r.WhichOneof("record_type") == "config":
            config.update({i.key: json.loads(i.value_json) for i in r.config.update})
    assert config["seed"] == 3 and config["model"]["hidden_size"] == 32
    assert f"wandb sync {folder}" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# MLflow, file store
# --------------------------------------------------------------------------------------------


def test_mlflow_file_store_holds_the_metrics_and_resumes(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = tmp_path / "base"
    cfg = LoggingSection(mlflow=True, mlflow_experiment="tests", tensorboard=False,
                         gpu_monitor_interval_s=0)
    _run(open_logger(run, True, cfg, CONFIG, stream=io.StringIO()))
    # Resume from a step-2 checkpoint: the same MLflow run continues.
    logger = open_logger(run, True, cfg, {**CONFIG, "train": {"max_steps": 6}},
                         stream=io.StringIO(), initial_step=2)
    for step in (3, 4, 5, 6):
        logger.log(step, "train", loss=0.5 / step)
    logger.close()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name("tests")
    (found,) = client.search_runs([exp.experiment_id])
    assert found.info.run_id == json.loads((run / "sinks.json").read_text())["mlflow_run_id"]
    assert found.info.run_name == "base" and found.info.status == "FINISHED"
    loss = sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id,
                                                                       "train/loss"))
    assert [s for s, _ in loss] == [1, 2, 3, 4, 5, 6]  # 3 and 4 once: the first process's
    assert dict(loss[:2]) == {1: 4.0, 2: 2.0} and loss[-1] == (6, pytest.approx(0.5 / 6))
    acc = client.get_metric_history(found.info.run_id, "eval/val_mlm_acc")
    assert [(m.step, m.value) for m in acc] == [(4, 0.25)]
    rank1 = client.get_metric_history(found.info.run_id, "train/rank_compute_s/1")
    assert [m.value for m in rank1] == [0.75] * 4
    params = found.data.params
    assert params["model.hidden_size"] == "32" and params["train.max_steps"] == "4"  # the first
    config = json.loads(Path(client.download_artifacts(found.info.run_id, "config.json",
                                                       str(tmp_path))).read_text())
    assert config["train"]["max_steps"] == 6  # the artifact follows the resumed config


def test_tensorboard_sink_tags(tmp_path, monkeypatch):
    """TensorBoard's own writer is optional here: a stand-in records what the sink hands it."""
    import types

    written = []

    class Writer:
        def __init__(self, log_dir):
            written.append(("dir", log_dir))

        def add_scalar(self, tag, value, global_step):
            written.append((tag, value, global_step))

        def add_text(self, tag, text):
            written.append((tag, text))

        def close(self):
            written.append(("closed",))

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard",
                        types.SimpleNamespace(SummaryWriter=Writer))
    logger = MetricsLogger(tmp_path, True, total_steps=4, stream=io.StringIO())
    assert logger.sink_names == ["tensorboard"]
    logger.log_config(CONFIG)
    _run(logger)
    assert written[0] == ("dir", str(tmp_path / "tensorboard"))
    assert written[1][0] == "config" and "model.hidden_size = 32" in written[1][1]
    assert ("train/loss", 2.0, 2) in written and ("eval/val_mlm_acc", 0.25, 4) in written
    assert ("train/rank_compute_s/1", 0.75, 4) in written
    assert not any(w[0] == "train/note" for w in written) and written[-1] == ("closed",)
    # tensorboard=False (or [logging] tensorboard = false): no writer at all.
    written.clear()
    _run(MetricsLogger(tmp_path / "b", True, tensorboard=False, stream=io.StringIO()))
    assert written == []


# --------------------------------------------------------------------------------------------
# Start-up failures, fine-tune runs renamed at the end, how a run ended
# --------------------------------------------------------------------------------------------


def test_a_sink_that_cannot_start_is_one_warning_and_the_run_goes_on(tmp_path, wandb_env,
                                                                     monkeypatch, capsys):
    """W&B online without an API key, an MLflow store that cannot be made, a server that is
    down: each was a traceback that ended the run; now one warning naming the sink and why.
    An explicit file-store URI works as the default one does (MLflow 3 refused it)."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NETRC", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    bad = [LoggingSection(wandb=True, wandb_mode="online"),
           LoggingSection(mlflow=True, mlflow_tracking_uri="file:///proc/mlruns"),
           LoggingSection(mlflow=True, mlflow_tracking_uri="http://127.0.0.1:9/")]
    for i, cfg in enumerate(bad):
        cfg = dataclasses.replace(cfg, tensorboard=False, gpu_monitor_interval_s=0)
        logger = open_logger(tmp_path / f"r{i}", True, cfg, CONFIG, stream=io.StringIO())
        assert logger.sink_names == []
        _run(logger)
        assert len(read_metrics(tmp_path / f"r{i}" / "metrics.jsonl")) == 5  # the run went on
        (line,) = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
        assert "could not start" in line
    assert 'wandb_mode = "online" but no W&B API key' in _warnings(bad[0], tmp_path, capsys)
    assert "file:///proc/mlruns" in _warnings(bad[1], tmp_path, capsys)
    assert "cannot connect to 127.0.0.1:9" in _warnings(bad[2], tmp_path, capsys)
    store = tmp_path / "shared-store"
    cfg = LoggingSection(mlflow=True, mlflow_tracking_uri=store.as_uri(), tensorboard=False,
                         gpu_monitor_interval_s=0)
    logger = open_logger(tmp_path / "ok", True, cfg, CONFIG, stream=io.StringIO())
    assert logger.sink_names == ["mlflow"]
    _run(logger)


def _warnings(cfg: LoggingSection, tmp_path: Path, capsys) -> str:
    cfg = dataclasses.replace(cfg, tensorboard=False, gpu_monitor_interval_s=0)
    open_logger(tmp_path / "again", True, cfg, None, stream=io.StringIO()).close()
    return capsys.readouterr().err


def test_a_renamed_fine_tune_is_named_and_found_at_its_final_folder(tmp_path, wandb_env,
                                                                    monkeypatch, capsys):
    """A fine-tune runs in OUT.tmp, renamed to OUT at the end: the sinks named it `seed_1.tmp`
    (every glue cell alike), MLflow's artifacts pointed into OUT.tmp (unreachable after the
    rename), the W&B hint named OUT.tmp, and the config had no task, init or data."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from bertgpu.telemetry.run_logger import renamed_run

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "glue1" / "CoLA" / "seed_1"
    work = out.with_name("seed_1.tmp")
    cfg = LoggingSection(mlflow=True, wandb=True, tensorboard=False, gpu_monitor_interval_s=0)
    cfg, config = renamed_run(cfg, work, CONFIG, {"task": "CoLA", "init": "run1",
                                                  "data": "glue_data", "max_seq_len": 64})
    assert cfg.wandb_run_name == cfg.mlflow_run_name == "glue1/CoLA/seed_1"
    assert config["task"] == "CoLA" and config["out"] == str(out) and config["seed"] == 3
    _run(open_logger(work, True, cfg, config, stream=io.StringIO()))
    (hint,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("W&B: offline")]
    assert f"wandb sync {out / 'wandb'}/offline-run-" in hint and ".tmp" not in hint
    work.rename(out)
    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    (found,) = client.search_runs([client.get_experiment_by_name("bertgpu").experiment_id])
    assert found.info.run_name == "glue1/CoLA/seed_1"
    assert found.data.params["task"] == "CoLA" and found.data.params["max_seq_len"] == "64"
    assert [a.path for a in client.list_artifacts(found.info.run_id)] == ["config.json"]
    got = client.download_artifacts(found.info.run_id, "config.json", str(tmp_path))
    assert json.loads(Path(got).read_text())["init"] == "run1"


@pytest.mark.parametrize(("reason", "status", "exit_code"), [
    ("diverged", "FAILED", 1), ("error", "FAILED", 1), ("preempted", "KILLED", 1),
    ("max_steps", "FINISHED", 0)])
def test_how_the_run_ended_reaches_the_tracking_runs(tmp_path, wandb_env, monkeypatch, reason,
                                                     status, exit_code):
    """A diverged or preempted run was FINISHED in MLflow and exit code 0 in W&B: the loop's
    end record (metrics.jsonl) now sets MLflow's status and W&B's exit code."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path / "run"
    cfg = LoggingSection(mlflow=True, wandb=True, tensorboard=False, gpu_monitor_interval_s=0)
    logger = open_logger(run, True, cfg, CONFIG, stream=io.StringIO())
    logger.log(1, "train", loss=1.0)
    logger.log(1, "info", event="end", reason=reason, error="training diverged: loss nan")
    logger.close()
    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    (found,) = client.search_runs([client.get_experiment_by_name("bertgpu").experiment_id])
    assert found.info.status == status and found.data.tags["end_reason"] == reason
    run_id = json.loads((run / "sinks.json").read_text())["wandb_run_id"]
    (folder,) = (run / "wandb").glob(f"offline-run-*-{run_id}")
    deadline = time.monotonic() + 30
    while True:
        records = _wandb_records(folder / f"run-{run_id}.wandb")
        exits = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
        if exits:
            break
        assert time.monotonic() < deadline, "the W&B run file was never completed"
        time.sleep(0.2)
    assert exits[0].exit_code == exit_code


def test_throttled_in_the_sinks_means_what_the_console_says(tmp_path):
    # Idle and clocks set on purpose are not "throttled" on the console, in watch or the report;
    # the sinks' gpuN/throttled must agree, or the W&B/MLflow panels show a GPU throttled all run.
    from bertgpu.telemetry.monitor import GpuMonitor

    nvml = SimulatedNvml([SimGpu(throttle=[0x2]), SimGpu(throttle=[0x1]), SimGpu(throttle=[0x100]),
                          SimGpu(throttle=[0x1 | 0x40]), SimGpu(throttle=[0x0])])
    mon = GpuMonitor(nvml, None, interval_s=5.0)
    mon.sample()
    sink = Recorder()
    logger = MetricsLogger(tmp_path, True, total_steps=2, stream=io.StringIO(), sinks=[sink],
                           monitor=mon, tensorboard=False)
    _run(logger, steps=2)
    (system, *_) = [c[3] for c in sink.calls if c[0] == "log" and c[2] == "system"]
    assert [system[f"gpu{i}/throttled"] for i in range(5)] == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert "throttled #3 hw_thermal" in mon.summary()
    assert mon.summary().count("throttled") == 1  # the console flags the same GPU alone


def test_resumed_wandb_run_hint_names_every_offline_folder(tmp_path, wandb_env, capsys):
    run = tmp_path / "run"
    cfg = LoggingSection(wandb=True, wandb_project="tests", wandb_mode="offline",
                         tensorboard=False, gpu_monitor_interval_s=0)
    _run(open_logger(run, True, cfg, CONFIG, stream=io.StringIO()))
    run_id = json.loads((run / "sinks.json").read_text())["wandb_run_id"]
    # The first process's folder, dated earlier as a run resumed later would find it (W&B names
    # folders by the second, so a resume within the same second would reuse the folder).
    (first,) = (run / "wandb").glob(f"offline-run-*-{run_id}")
    first.rename(first.with_name(f"offline-run-20000101_000000-{run_id}"))
    capsys.readouterr()
    logger = open_logger(run, True, cfg, CONFIG, stream=io.StringIO())  # the resume
    for step in (5, 6):
        logger.log(step, "train", loss=1.0)
    logger.close()
    folders = sorted((run / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all(f.name.endswith(run_id) for f in folders)
    (hint,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("W&B: offline")]
    command = hint.split("`")[1]
    assert command.startswith("wandb sync ")
    # The glob of the printed command (as a shell expands it) is every folder of the run.
    assert sorted(Path("/").glob(command.removeprefix("wandb sync /"))) == folders
