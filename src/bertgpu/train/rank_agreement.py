"""The ranks of a job agree on what they train before the first step.

Each machine of a multi-node job runs its own `bertgpu pretrain` command, and nothing made them
the same: a node given another lr trained at it while config.toml said rank 0's, one given
other shards trained on two data sets, one given another train.max_steps left rank 0 waiting in
a collective until distributed.timeout_minutes. One that failed a start-up check (a held
lock, a bad override) exited at once while the others waited in init_process_group for the
whole timeout and died of a store timeout that named no cause. So, at start-up:

- `hand_over` (cli.py, once it said the line; `startup_shared` notes the config's timeout): a
  rank whose start-up fails under a multi-process launch, an argparse error included, hands
  its one line to the others through the rendezvous store (train/startup_gate.py: no device,
  no backend), and they stop with it ("rank 1 stopped at start-up: ...") instead of waiting
  out the timeout.
- `agree`: right after the group exists, every rank all-gathers what it will train (its config,
  less what may differ per machine, its shard set's identity and its --init model's, not their
  paths); any difference from rank 0's
  stops every rank with the same line. Then rank 0 writes a token into the run folder that every
  other rank must read back: `--out` is one folder every node sees (a fresh run with another
  --out per node trained, a stale run folder at the same path on a node's disk was resumed).
- `same_checkpoint` (train/checkpoint.py's `load_resume`): the ranks resume from the same
  checkpoint, the same bytes and not another copy of the same step, or all stop in one line.

A single process (no WORLD_SIZE, or a world of one) does none of this.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError, one_line
from bertgpu.train import distributed, startup_gate
from bertgpu.train.run_folder import SHARED_CHECK, shown_value
from bertgpu.train.setup_signals import stop_ends_setup

PER_MACHINE = ("out", "data.dir", "impl.num_workers")
"""Config keys that may differ between ranks: where this machine finds the run folder and the
shards (their identity is compared instead), and this process's loader workers."""
SAME_COMMAND = "every machine must run the same command and recipe"
SHARED_OUT = ("--out must be one folder every node sees (on a shared filesystem), not a folder "
              "of the same name on each machine")


class _Startup:
    """What `startup_shared` needs to join the group: the config, once it is read."""

    cfg: Any = None


def _launched() -> bool:
    """Under torchrun or `--nproc` with other ranks (their rendezvous address set)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "MASTER_ADDR" in os.environ


@contextlib.contextmanager
def startup_shared() -> Iterator[_Startup]:
    """Around a rank's start-up, up to `agree`: an error raised before it (a bad override, a held
    run-folder lock, a run folder it refuses) is handed to the other ranks by cli.py once it
    said the line (`hand_over`: the line came only after the wait), for as long as the config's
    distributed.timeout_minutes. Without it the others waited in init_process_group for that
    long. Set `.cfg` once the config is read."""
    startup = _Startup()
    startup_gate.reset()
    try:
        yield startup
    except Exception:
        if startup.cfg is not None:
            startup_gate.note_timeout(startup.cfg.distributed.timeout_minutes)
        raise


def hand_over(line: str, timeout_minutes: float | None) -> None:
    """Under a multi-process launch, a rank that stops before it joined the group gives the
    others its `line` through the rendezvous store, as they wait to make the group (a rank past
    that point meets the others' errors in its collectives: nothing to do). No device and no
    backend are needed, so this works without the config (cfg None: an argparse error, a recipe
    that does not parse), on a GPU node of a CPU job, or on a node without the job's GPU. Best
    effort: a rendezvous that fails leaves only its own line. The timeout is the config's when
    it was read (`startup_shared`), else `timeout_minutes`. A stop (Ctrl-C, SIGTERM) ends the
    wait at once, as it ends a healthy rank's (train/setup_signals.py): it waits in C++."""
    if not _launched() or startup_gate.said():
        return
    minutes = startup_gate.noted_timeout() or timeout_minutes or distributed.DEFAULT_TIMEOUT_MINUTES
    try:
        with stop_ends_setup(int(os.environ.get("RANK", "0"))):
            startup_gate.hand_over(line, float(minutes))
    except Exception:  # noqa: BLE001 - its own error, raised by the caller, says the rest
        pass


def typed_timeout(words: list[str]) -> float | None:
    """--distributed.timeout_minutes as typed among command-line `words` (the last wins), or
    None: how long a rank whose command line did not parse waits to hand its line over."""
    found = None
    for i, word in enumerate(words):
        name, eq, text = word.partition("=")
        if name == "--distributed.timeout_minutes":
            found = text if eq else (words[i + 1] if i + 1 < len(words) else None)
    try:
        return float(found) if found is not None and float(found) > 0 else None
    except ValueError:
        return None


def agree(cfg: Any, info: distributed.DistInfo, allow_data_change: bool) -> None:
    """Every rank, right after the process group exists: stop them all, with one line, when a
    rank failed its start-up (`startup_shared`) or will train anything else than rank 0 (the
    first few differing keys, with both values), then check that they share the run folder."""
    if info.world_size == 1:
        return
    own = None
    try:
        mine: dict[str, Any] = {"recipe": describe(cfg, allow_data_change), "out": str(cfg.out),
                                "data": str(cfg.data.dir), "init": str(cfg.init)}
    except BertgpuError as exc:
        own, mine = exc, {"error": one_line(exc)}
    everyone = distributed.gather_objects(mine)
    failed = [(r, e["error"]) for r, e in enumerate(everyone) if "error" in e]
    if own is not None:
        raise own
    if failed:
        rank, line = failed[0]
        raise BertgpuError(f"rank {rank} stopped at start-up: {line}")
    _check_same_recipe(everyone)
    _check_shared_folder(Path(cfg.out), info, everyone, cfg.distributed.timeout_minutes)


def describe(cfg: Any, allow_data_change: bool) -> dict[str, Any]:
    """What this rank will train, flat: every config key but `PER_MACHINE`, the shard set's
    identity (its manifest.json's sha256, as checkpoints record it), --init's model's identity
    in place of its path (`init_identity`: a published model mounted at another path on each
    node is the same model) and --allow-data-change."""
    from bertgpu.config import overrides
    from bertgpu.telemetry.sinks import flatten_config

    manifest = Path(cfg.data.dir) / "manifest.json"
    try:
        shard_set = hashlib.sha256(manifest.read_bytes()).hexdigest()
    except OSError as e:
        raise BertgpuError(f"{manifest}: cannot read the shard set ({e.strerror}); expected "
                           "--data to be a shard set written by `bertgpu prepare` that this "
                           "machine sees (a shared folder or an identical copy)") from None
    flat = flatten_config(overrides.config_to_dict(cfg))
    described = {k: v for k, v in flat.items() if k not in PER_MACHINE}
    described["shard set"] = shard_set
    if cfg.init:
        described["init"] = init_identity(cfg.init)
    described["allow-data-change"] = bool(allow_data_change)
    return described


def _check_same_recipe(everyone: list[dict[str, Any]]) -> None:
    """The first rank whose description differs from rank 0's, in one line: its first three
    differing keys with both values."""
    first = everyone[0]
    for rank, other in enumerate(everyone[1:], start=1):
        keys = sorted(set(first["recipe"]) | set(other["recipe"]))
        differ = [k for k in keys if first["recipe"].get(k) != other["recipe"].get(k)]
        if not differ:
            continue
        said = [(_item(k, other)[0], _item(k, first)[1]) for k in differ[:3]]
        more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
        rest = "".join(f", its {theirs} from {ours}" for theirs, ours in said[1:])
        raise BertgpuError(f"rank {rank}'s {said[0][0]} differs from rank 0's {said[0][1]}{rest}"
                           f"{more}: {SAME_COMMAND}")


def _item(key: str, described: dict[str, Any]) -> tuple[str, str]:
    """(the key as its flag with this rank's value, the value alone) of one differing key."""
    value = described["recipe"].get(key)
    if key == "shard set":
        shown = f"(--data {described['data']}, its manifest.json sha256 {str(value)[:12]})"
        return f"shard set {shown}", shown
    if key == "init" and value is not None:
        shown = f"(--init {described['init']}, its model digest {str(value)[:12]})"
        return f"init model {shown}", shown
    shown = "unset" if key not in described["recipe"] else shown_value(value)
    return f"--{key} {shown}", shown


def _check_shared_folder(run_dir: Path, info: distributed.DistInfo,
                         everyone: list[dict[str, Any]], timeout_minutes: float) -> None:
    """Rank 0 writes a fresh token into the run folder; every other rank must read it back.
    A rank on another machine that has no such folder, or a folder of its own at that path
    (another run's checkpoints, which it then resumed from while rank 0 resumed from the
    shared one), stops every rank with one line. The token is gone once every rank read it."""
    token, made, problem = None, False, None
    if info.is_main:
        try:
            made = not run_dir.exists()
            run_dir.mkdir(parents=True, exist_ok=True)
            token = secrets.token_hex(16)
            (run_dir / SHARED_CHECK).write_text(token, encoding="utf-8")
        except OSError as e:
            problem = f"{run_dir}: rank 0 cannot write the run folder ({e.strerror})"
    try:
        token, problem = rank_0s((token, problem))
        seen = None if info.is_main or problem else _read_token(run_dir, token, timeout_minutes)
        found = distributed.gather_objects(seen)
    finally:
        if info.is_main:
            with contextlib.suppress(OSError):
                (run_dir / SHARED_CHECK).unlink(missing_ok=True)
                if made:
                    run_dir.rmdir()  # only while empty: the run writes it later
    if problem:
        raise BertgpuError(problem)
    for rank, seen in enumerate(found):
        if seen is None:
            continue
        theirs, ours = everyone[rank]["out"], everyone[0]["out"]
        where = f"its --out {theirs}" + (f", rank 0's {ours}" if theirs != ours else "")
        raise BertgpuError(f"rank {rank} does not see the run folder rank 0 writes ({where}: "
                           f"{seen}); {SHARED_OUT}")


_SAMPLE = 1 << 20  # bytes hashed at each end of a weights file


def init_identity(init: str) -> str:
    """What identifies `--init`'s model wherever it is mounted: a sha256 over the files of the
    folder it resolves to (a run folder's newest good checkpoint) that make the model, each by
    name, size and its first and last MiB (config.json and a checkpoint's checksums.json,
    smaller, whole): the weights bertgpu loads (`hf_io.weight_files`), config.json,
    checksums.json and the tokenizer's files. Two copies of one model agree, whatever else their
    folders hold (a README.md, a pytorch_model.bin beside model.safetensors: they were refused
    as two models); two models differ, without reading gigabytes of weights."""
    from bertgpu.models.hf_io import TOKENIZER_FILES, resolve_checkpoint_folder, weight_files

    folder = resolve_checkpoint_folder(init)
    digest = hashlib.sha256()
    try:
        named = [folder / name for name in ("config.json", "checksums.json", *TOKENIZER_FILES)]
        for path in sorted({*weight_files(folder), *(p for p in named if p.is_file())}):
            size = path.stat().st_size
            digest.update(f"{path.name}\0{size}\0".encode())
            with path.open("rb") as f:
                digest.update(f.read(_SAMPLE))
                if size > 2 * _SAMPLE:
                    f.seek(size - _SAMPLE)
                digest.update(f.read(_SAMPLE))
    except OSError as e:
        raise BertgpuError(f"{folder}: cannot read the --init model ({e.strerror}); expected a "
                           "folder this machine sees (a shared folder or an identical copy)"
                           ) from None
    return digest.hexdigest()


def rank_0s(obj: Any) -> Any:
    """Rank 0's `obj` (picklable) on every rank of the group."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _read_token(run_dir: Path, token: str, timeout_minutes: float) -> str | None:
    """None when `run_dir` holds rank 0's `token`, else what it holds. A token not there yet is
    looked for again for a while (a network filesystem may show a new file late), never as long
    as the collective timeout that rank 0 waits under meanwhile."""
    path = run_dir / SHARED_CHECK
    deadline = time.monotonic() + min(60.0, timeout_minutes * 60.0 / 4)
    while True:
        with contextlib.suppress(OSError):
            os.listdir(run_dir)  # refreshes a network filesystem's view of the folder
        try:
            found = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            found = None
        if found == token:
            return None
        if time.monotonic() >= deadline:  # (another token may be a late view of a killed
            if found is not None:  # job's, or of rank 0's write half-way: looked at again)
                return f"its {SHARED_CHECK} is another run's"
            return "no such folder" if not run_dir.is_dir() else "no token from rank 0 in it"
        time.sleep(0.2)


def same_checkpoint(path: Path | None, problem: str | None, info: distributed.DistInfo) -> None:
    """Every rank (of a group of more than one) resumes from the same checkpoint: rank 0's
    `path`, the one the others opened under the same name (`problem`: why one could not), the
    same bytes by its checksums.json. Stops every rank with the same line otherwise."""
    digest = None
    if path is not None and problem is None:
        try:
            digest = hashlib.sha256((path / "checksums.json").read_bytes()).hexdigest()
        except OSError as e:
            problem = f"{path}: cannot read checksums.json ({e.strerror})"
    everyone = distributed.gather_objects((digest, problem))
    for rank, (theirs, why) in enumerate(everyone):
        if why is not None:
            raise BertgpuError(f"rank {rank} cannot open the checkpoint rank 0 resumes from "
                               f"({why}); {SHARED_OUT}")
        if theirs != everyone[0][0]:
            name = path.name if path is not None else "checkpoint"
            raise BertgpuError(f"rank {rank} resumes from another {name} than rank 0 (its "
                               f"checksums.json differs); {SHARED_OUT}")
