"""Where metrics go besides ``metrics.jsonl`` and the console: TensorBoard, W&B, MLflow.

Each sink is optional and off unless asked for in the ``[logging]`` section (TensorBoard: on when
its package is installed, as before). The training loop only talks to ``MetricsLogger``;
``run_logger.open_logger`` builds it with the sinks and the GPU monitor the section asks for.

Only rank 0 writes to sinks. Each gets the resolved config once (``log_config``), then every log
event as ``log(step, kind, scalars)`` with ``kind`` "train", "eval", "info" or "system" (the
GPU monitor's latest sample of every GPU, at each train log). Sinks are called from one
background thread, so a slow tracking server never stalls a training step; a sink that fails is
switched off with one warning and the run goes on.

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
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bertgpu.errors import BertgpuError

if TYPE_CHECKING:
    from bertgpu.config.sections import LoggingSection



class Sink(Protocol):
    """One place metrics go. Called from the sink thread only, never concurrently."""

    name: str

    def log(self, step: int, kind: str, scalars: Mapping[str, float]) -> None: ...

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


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
    """Scalars ``KIND/KEY`` at the optimizer step, under ``log_dir``."""

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    @classmethod
    def open_if_installed(cls, log_dir: Path) -> TensorBoardSink | None:
        try:
            return cls(log_dir)
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
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "online" if "api.wandb.ai" in netrc.read_text(encoding="utf-8") else "offline"
    except OSError:
        return "offline"


class WandbSink:
    """A W&B run: keys ``KIND/KEY``, W&B's step = the optimizer step."""

    name = "wandb"

    def __init__(self, run_dir: Path, cfg: LoggingSection) -> None:
        import wandb

        self.mode = _wandb_mode(cfg)
        run_id = _recall(run_dir, "wandb_run_id")
        self._run = wandb.init(
            project=cfg.wandb_project, entity=cfg.wandb_entity,
            name=cfg.wandb_run_name or run_dir.resolve().name, dir=str(run_dir), mode=self.mode,
            id=run_id, resume="allow" if run_id else None,
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
        folder = getattr(self._run, "dir", None)
        self._run.finish()
        if self.mode == "offline" and folder:
            print(f"W&B: offline run in {Path(folder).parent}; upload it with "
                  f"`wandb sync {Path(folder).parent}`", file=sys.stderr, flush=True)


class MlflowSink:
    """An MLflow run: metrics ``KIND/KEY`` at the optimizer step, the config as parameters."""

    name = "mlflow"

    def __init__(self, run_dir: Path, cfg: LoggingSection) -> None:
        uri = cfg.mlflow_tracking_uri
        if uri is None:
            # MLflow 3 keeps its file store in maintenance mode behind this switch; a local file
            # store needs no server and no database package, so it is our default.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (run_dir / "mlruns").resolve().as_uri()
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=uri)
        exp = self._client.get_experiment_by_name(cfg.mlflow_experiment)
        exp_id = exp.experiment_id if exp else self._client.create_experiment(cfg.mlflow_experiment)
        run_id = _recall(run_dir, "mlflow_run_id")
        self.resumed = False
        if run_id:
            try:
                self._client.update_run(run_id, status="RUNNING")
                self.resumed = True
            except Exception:  # the store was moved or deleted: start a new run
                run_id = None
        if not run_id:
            run = self._client.create_run(exp_id, run_name=cfg.mlflow_run_name or
                                          run_dir.resolve().name)
            run_id = run.info.run_id
            _remember(run_dir, "mlflow_run_id", run_id)
        self.run_id = run_id
        self.tracking_uri = uri

    def log(self, step: int, kind: str, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        metrics = [Metric(f"{kind}/{k}", float(v), ms, step) for k, v in scalars.items()]
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
        self._client.log_dict(self.run_id, dict(config), "config.json")

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


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


# --------------------------------------------------------------------------------------------
# Fan-out on a background thread
# --------------------------------------------------------------------------------------------


def sink_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics record for a sink: no bookkeeping keys, no text or booleans,
    no NaN; a per-rank list ``rank_compute_s`` becomes ``rank_compute_s/0``, ``/1``, ..."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("step", "kind", "time"):
            continue
        values = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, v in values:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out[key if i is None else f"{key}/{i}"] = v
    return out


def system_scalars(samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """GPU samples -> ``{"gpu0/temp_c": 65.0, ...}`` for the sinks' "system" kind."""
    out: dict[str, float] = {}
    for s in samples:
        for key, value in s.items():
            if key not in ("time", "step", "gpu") and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):
                out[f"gpu{s['gpu']}/{key}"] = value
        if "throttle" in s:
            out[f"gpu{s['gpu']}/throttled"] = float(bool(s["throttle"]))
    return out


class SinkFanout:
    """Hands every event to every sink on one daemon thread, in order."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)
        self._queue: queue.Queue[tuple[str, tuple[Any, ...]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="bertgpu-sinks", daemon=True)
        self._thread.start()
        self._closed = False

    def log(self, step: int, kind: str, scalars: Mapping[str, float]) -> None:
        if scalars and not self._closed:
            self._queue.put(("log", (step, kind, dict(scalars))))

    def log_config(self, config: Mapping[str, Any]) -> None:
        if not self._closed:
            self._queue.put(("log_config", (dict(config),)))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            method, args = item
            for sink in list(self.sinks):
                self._call(sink, method, args)
        for sink in self.sinks:
            self._call(sink, "close", ())

    def _call(self, sink: Sink, method: str, args: tuple[Any, ...]) -> None:
        try:
            getattr(sink, method)(*args)
        except Exception as e:  # a sink must not end a training run
            if sink in self.sinks:
                self.sinks.remove(sink)
            print(f"bertgpu: the {sink.name} sink failed in {method} ({type(e).__name__}: "
                  f"{str(e)[:200]}); it is off for the rest of the run", file=sys.stderr,
                  flush=True)

    def close(self, timeout_s: float = 120.0) -> None:
        """Deliver what is queued, close every sink, and wait (at most ``timeout_s``)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            print(f"bertgpu: metric sinks still busy after {timeout_s:.0f} s; not waiting",
                  file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Building the logger
# --------------------------------------------------------------------------------------------
