"""Where metrics go besides ``metrics.jsonl`` and the console: TensorBoard, W&B, MLflow.

Each sink is optional and off unless asked for in the ``[logging]`` section (TensorBoard: on when
its package is installed, as before). The training loop only talks to ``MetricsLogger``;
``run_logger.open_logger`` builds it with the sinks and the GPU monitor the section asks for.

Only rank 0 writes to sinks. Each gets the resolved config once (``log_config``), then every log
event as ``log(step, kind, scalars)`` with ``kind`` "train", "eval", "info" or "system" (the
GPU monitor's latest sample of every GPU, at each train log). Sinks are called from one
background thread, so a slow tracking server never stalls a training step; a sink that fails,
or cannot start (no API key, a server that is down), is switched off with one warning and the run
goes on (telemetry/fanout.py). At the end, MLflow's run status (FAILED, KILLED) and W&B's exit
code follow the loop's end record (``end_reason``), also when a preemption grace runs out: the
sinks then get the seconds each says its close needs (``close_s``) before the process ends.

W&B without network: ``wandb_mode = "offline"`` (or ``"auto"`` without an API key) writes the
run under ``RUN_DIR/wandb/``; upload it later with ``wandb sync RUN_DIR/wandb/offline-run-*``.
MLflow without a server: a file store in ``RUN_DIR/mlruns`` (browse it with the full mlflow
package: ``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri RUN_DIR/mlruns``). A
resumed run continues the same W&B and MLflow runs (their ids are kept in
``RUN_DIR/sinks.json``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertgpu.errors import BertgpuError

# The fan-out thread and the protocol, once here: their importers still find them here.
from bertgpu.telemetry.fanout import Sink, SinkFanout, sink_scalars, system_scalars  # noqa: F401

if TYPE_CHECKING:
    from bertgpu.config.sections import LoggingSection


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _require(flag: str, module: str, extra: str) -> None:
    if not _installed(module):
        raise BertgpuError(f"logging.{flag} = true but the {module} package is not installed; "
                           f"expected `pip install 'bertgpu[{extra}]'` or logging.{flag} = false")


def check_packages(cfg: LoggingSection) -> None:
    """The packages the asked-for sinks need are importable (else one-line BertgpuError)."""
    cfg.validate()
    if cfg.tensorboard:
        _require("tensorboard", "tensorboard", "tensorboard")
    if cfg.wandb:
        _require("wandb", "wandb", "wandb")
    if cfg.mlflow:
        _require("mlflow", "mlflow", "mlflow")


# --------------------------------------------------------------------------------------------
# The sinks
# --------------------------------------------------------------------------------------------


class TensorBoardSink:
    """Scalars ``KIND/KEY`` at the optimizer step, under ``log_dir``.

    ``purge_after``: the step a resumed run continues from. The events an earlier process of
    the run wrote for later steps were of a timeline that no longer is (the resumed run goes
    through those steps again), as their records in metrics.jsonl, which the resume removes:
    TensorBoard cannot delete them either, but its ``purge_step`` makes every reader drop them.
    A folder without events yet needs no purge."""

    name = "tensorboard"
    close_s = 0.5  # flushes the event file (its records wait in memory until then)

    def __init__(self, log_dir: Path, purge_after: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        earlier = any(Path(log_dir).glob("*tfevents*"))
        purge = {"purge_step": purge_after + 1} if earlier else {}
        self._writer = SummaryWriter(log_dir=str(log_dir), **purge)

    @classmethod
    def open_if_installed(cls, log_dir: Path, purge_after: int = 0) -> TensorBoardSink | None:
        try:
            return cls(log_dir, purge_after)
        except Exception:  # ImportError without tensorboard; anything odd in its import chain
            return None

    def log(self, step: int, kind: str, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(f"{kind}/{key}", value, global_step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        text = "\n".join(f"    {k} = {v!r}" for k, v in flatten_config(config).items())
        self._writer.add_text("config", text)  # indented: TensorBoard renders it as code

    def close(self) -> None:
        self._writer.close()


def _wandb_mode(cfg: LoggingSection) -> str:
    if cfg.wandb_mode != "auto":
        return cfg.wandb_mode
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if env:
        return "offline" if env in ("offline", "dryrun") else env
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    return "online" if _wandb_key() else "offline"


class WandbSink:
    """A W&B run: keys ``KIND/KEY``, W&B's step = the optimizer step. ``final`` is the folder the
    run will live in once complete (a fine-tune's ``OUT`` while it runs in ``OUT.tmp``): it names
    the run and the folder the upload hint gives."""

    name = "wandb"
    close_s = 5.0  # `finish` hands the run to W&B's service process and waits for it

    def __init__(self, run_dir: Path, cfg: LoggingSection, final: Path | None = None) -> None:
        import wandb

        self.mode = _wandb_mode(cfg)
        self.run_dir, self.final = run_dir, final or run_dir
        if self.mode == "online" and not _wandb_key():
            raise SinkStartError(f'logging.wandb_mode = "{self.mode}" but no W&B API key '
                                 '(wandb login, or wandb_mode = "offline")')
        run_id = _recall(run_dir, "wandb_run_id")
        self._run = wandb.init(
            project=cfg.wandb_project, entity=cfg.wandb_entity,
            name=cfg.wandb_run_name or self.final.resolve().name, dir=str(run_dir),
            mode=self.mode, id=run_id, resume="allow" if run_id else None,
            settings=wandb.Settings(console="off"),  # our console stays ours (tqdm, plain lines)
        )
        _remember(run_dir, "wandb_run_id", self._run.id)
        self._last_step = -1

    def log(self, step: int, kind: str, scalars: Mapping[str, float]) -> None:
        # W&B drops steps that go backwards (the steps a resumed run repeats): skip them here.
        if step < self._last_step:
            return
        self._last_step = step
        self._run.log({f"{kind}/{k}": v for k, v in scalars.items()}, step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)

    def close(self) -> None:
        folder = getattr(self._run, "dir", None)  # RUN_DIR/wandb/offline-run-*/files
        reason, error = end_reason(self.run_dir)
        self._run.summary["end_reason"] = reason
        if error:
            self._run.summary["end_error"] = error
        if reason == "preempted" and hasattr(self._run, "mark_preempting"):
            self._run.mark_preempting()
        # W&B marks a run with a non-zero exit code as failed: a divergence, an error, a stop.
        self._run.finish(exit_code=1 if reason in (*_FAILED, "preempted") else 0)
        if self.mode == "offline" and folder:
            # Where the folder will be once a fine-tune's OUT.tmp is renamed to OUT; a resumed
            # run has one offline folder per process, and `wandb sync` needs all of them.
            here = Path(folder).parent
            there = self.final / here.relative_to(self.run_dir) if here.is_relative_to(
                self.run_dir) else here
            if len(list(here.parent.glob("offline-run-*"))) > 1:
                there = there.parent / "offline-run-*"
            print(f"W&B: offline run in {there}; upload it with `wandb sync {there}`",
                  file=sys.stderr, flush=True)


def _wandb_key() -> bool:
    """Whether W&B will find an API key: WANDB_API_KEY or a netrc entry (`wandb login`)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb" in netrc.read_text(encoding="utf-8")
    except OSError:
        return False


class SinkStartError(Exception):
    """A sink that cannot start, with the one line that says why (`open_logger` warns with it)."""


# The end record's reasons (train/loop.py) of a run that failed; "preempted" is a stop from
# outside. Other reasons (max_steps, budget) and a logger closed without an end record succeed.
_FAILED = ("diverged", "error")


def end_reason(run_dir: Path) -> tuple[str, str]:
    """(reason, error) of the end record of the run as it stands in ``run_dir/metrics.jsonl``
    (the loop writes it before the sinks close); ("unknown", "") without one."""
    from bertgpu.telemetry.records import run_end

    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))  # the tail holds the newest records
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return "unknown", ""
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # the first line of the tail may be cut
            continue
        if isinstance(record, dict):
            records.append(record)
    end = run_end(records)
    if end is None:
        return "unknown", ""
    return str(end.get("reason", "unknown")), str(end.get("error", ""))


def _file_store(uri: str) -> bool:
    return uri.startswith("file:") or "://" not in uri


def _check_reachable(uri: str) -> None:
    """A tracking server that does not answer a connection fails here in seconds: MLflow's
    own client retries a refused connection for minutes before it gives up."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=10).close()
    except OSError as e:
        raise SinkStartError(f"logging.mlflow_tracking_uri {uri}: cannot connect to "
                             f"{parts.hostname}:{port} ({e.strerror or e}); expected a running "
                             "MLflow server, or no URI for a file store in the run folder") from e


class MlflowSink:
    """An MLflow run: metrics ``KIND/KEY`` at the optimizer step, the config as parameters.
    ``final``: the folder the run will live in once complete (a fine-tune's ``OUT`` while it
    runs in ``OUT.tmp``). MLflow records absolute artifact paths, so a store that moves with
    the run folder gets its artifacts at their final place (``final/mlartifacts``)."""

    name = "mlflow"
    close_s = 2.0  # two or three calls to the store: tags, then the run's status

    def __init__(self, run_dir: Path, cfg: LoggingSection, final: Path | None = None) -> None:
        uri = cfg.mlflow_tracking_uri
        final = final or run_dir
        self.run_dir = run_dir
        # Written by hand inside run_dir, where the store's rename takes them (None: MLflow's).
        self._artifacts_here: Path | None = None
        artifact_location = None
        if uri is None:
            uri = (run_dir / "mlruns").resolve().as_uri()
            if final.resolve() != run_dir.resolve():
                artifact_location = (final / "mlartifacts").resolve().as_uri()
                self._artifacts_here = run_dir / "mlartifacts"
        if _file_store(uri):
            # MLflow 3 keeps its file store in maintenance mode behind this switch; a local file
            # store needs no server and no database package, so it is our default.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        _check_reachable(uri)
        from mlflow.tracking import MlflowClient

        try:
            self._client = MlflowClient(tracking_uri=uri)
            exp = self._client.get_experiment_by_name(cfg.mlflow_experiment)
            exp_id = exp.experiment_id if exp else self._client.create_experiment(
                cfg.mlflow_experiment, artifact_location=artifact_location)
        except Exception as e:  # the first call that touches the store says what is wrong
            text = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            raise SinkStartError(f"logging.mlflow_tracking_uri {uri}: cannot open the store "
                                 f"({type(e).__name__}: {text})") from e
        run_id = _recall(run_dir, "mlflow_run_id")
        self.resumed = False
        self._logged_to: dict[str, int] = {}  # a resumed run's metrics: the last step of each
        if run_id:
            try:
                self._client.update_run(run_id, status="RUNNING")
                self._logged_to = _last_steps(self._client.get_run(run_id))
                self.resumed = True
            except Exception:  # the store was moved or deleted: start a new run
                run_id = None
        if not run_id:
            run = self._client.create_run(exp_id, run_name=cfg.mlflow_run_name or
                                          final.resolve().name)
            run_id = run.info.run_id
            _remember(run_dir, "mlflow_run_id", run_id)
        self.run_id = run_id
        self.tracking_uri = uri

    def log(self, step: int, kind: str, scalars: Mapping[str, float]) -> None:
        """A resumed run goes through the steps after its checkpoint again. MLflow cannot delete
        the points an earlier process logged for them, and a second point at a step reads as a
        duplicate (two losses at step 30): each metric keeps the points it has, and gets the
        steps after them. After an exact resume the losses are the same; timings differ, and a
        resume with changed settings shows the earlier values up to where that process got
        (W&B drops them as well: ``WandbSink.log``)."""
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        metrics = [Metric(f"{kind}/{k}", float(v), ms, step) for k, v in scalars.items()
                   if step > self._logged_to.get(f"{kind}/{k}", -1)]
        for i in range(0, len(metrics), 1000):  # MLflow's limit per batch
            self._client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        # Parameters cannot change once logged, and a resumed run may change some (max_steps):
        # a resumed run keeps its first parameters; the full config is an artifact every time.
        if not self.resumed:
            params = [Param(k, str(v)[:6000]) for k, v in flatten_config(config).items()]
            for i in range(0, len(params), 100):  # MLflow's limit per batch
                self._client.log_batch(self.run_id, params=params[i:i + 100])
        if self._artifacts_here is None:
            self._client.log_dict(self.run_id, dict(config), "config.json")
            return
        # MLflow would write to the final folder, which must not exist before the rename.
        path = self._artifacts_here / self.run_id / "artifacts" / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(config), indent=2, default=str) + "\n", encoding="utf-8")

    def close(self) -> None:
        reason, error = end_reason(self.run_dir)
        self._client.set_tag(self.run_id, "end_reason", reason)
        if error:
            self._client.set_tag(self.run_id, "end_error", error[:5000])
        status = ("FAILED" if reason in _FAILED else "KILLED" if reason == "preempted"
                  else "FINISHED")
        self._client.set_terminated(self.run_id, status=status)


def _last_steps(run: Any) -> dict[str, int]:
    """The last step of each metric of an MLflow run: the store's latest value of a metric is
    that of its largest step, and ``get_run`` returns it with the step (one call, any store)."""
    return {m.key: int(m.step) for m in run.data.to_proto().metrics}


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flatten_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _sinks_file(run_dir: Path) -> Path:
    return run_dir / "sinks.json"


def _recall(run_dir: Path, key: str) -> str | None:
    try:
        value = json.loads(_sinks_file(run_dir).read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _remember(run_dir: Path, key: str, value: str) -> None:
    path = _sinks_file(run_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        data = data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        data = {}
    data[key] = value
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
