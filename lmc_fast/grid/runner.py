"""Running a grid: every (pair, method) unit once, resumable, split across torchrun's ranks.

Each finished unit is one JSON file, OUT/units/<key>.json, written atomically by the rank that
computed it; each alignment is OUT/alignments/<key>.safetensors; a unit's sweep records its
progress in OUT/sweeps/<key>/ (removed once the unit is stored), so a killed sweep resumes too. A unit whose file exists is
not run again (unless resume=False), so a run killed at any moment continues where it stopped.
When every rank is done, rank 0 rebuilds results.jsonl (unit order), the summaries and plots
from the unit files.
"""
from __future__ import annotations

import datetime
import json
import re
import shutil
import time
from pathlib import Path

from ..match.methods import REGISTRY
from .dist import Group, process_group
from .models import ModelCache, check_model_folders, model_paths, train_recipe_models
from .spec import GridSpec, load_spec, parse_spec
from .units import Unit, make_units, my_units

def _as_spec(spec) -> GridSpec:
    if isinstance(spec, GridSpec):
        return spec
    if isinstance(spec, dict):
        return parse_spec(spec)
    return load_spec(spec)


def _data(spec: GridSpec):
    """(train dataset, test dataset) of the spec's data (the grammar of the CLI's --data)."""
    from ..data_specs import DEFAULT_BLOCK_SIZE, load_data

    try:
        return load_data(spec.data, spec.block_size or DEFAULT_BLOCK_SIZE)
    except ValueError as exc:
        raise ValueError(f"data.spec: {exc}") from None


def with_block_size(spec: GridSpec) -> GridSpec:
    """`spec` with the block size its text is read in, by the CLI's rule (data_specs.block_size_for):
    data.block_size, else the block the first model was trained on, else min(64, every model's
    context), read from the checkpoints' headers (no weights), before any unit; a block longer than
    a model's context is refused in one line. Left unset where it is 64 (the keys of earlier units
    hold None for it); recipe models are trained on their data's blocks."""
    import dataclasses

    from ..data_specs import DEFAULT_BLOCK_SIZE, block_size_for, is_text_spec

    if not spec.models or not is_text_spec(spec.data):
        return spec
    from ..io import inspect_checkpoint
    from ..models.adapters import adapter_for

    contexts, recorded = [], None
    for k, path in enumerate(spec.models):
        info = inspect_checkpoint(path)
        model, adapter = info.meta_model, adapter_for(info.meta_model)
        tokens = adapter.arch(model).inputs == "tokens"
        contexts.append((path, adapter.shape_fields(model).get("context") if tokens else None))
        if k == 0:
            recorded = info.metadata.get("block_size") if isinstance(info.metadata, dict) else None
    block = block_size_for(spec.block_size, recorded, contexts, "data.block_size")
    if spec.block_size is None and block == DEFAULT_BLOCK_SIZE:
        return spec
    return dataclasses.replace(spec, block_size=block)


def _batches(dataset, batch_size: int, shuffle: bool, max_batches: int | None, device: str) -> list:
    from ..data import loader

    out = []
    for x, y in loader(dataset, batch_size, shuffle=shuffle, seed=0):
        if max_batches is not None and len(out) >= max_batches:
            break
        out.append((x.to(device), y.to(device)))
    return out


def _align_options(method: str, options: dict) -> dict:
    opts = dict(options)
    if "augment" in opts:  # by name, as the CLI's --augment (a TOML value cannot be an object)
        from ..data_specs import augmentation

        opts["augment"] = augmentation(opts["augment"])  # a known name: checked with the spec
    return opts


#: methods whose solve takes checkpoint=PATH and resumes from it (a killed learned unit loses at most
#: `checkpoint_every` steps; default every `eval_every`)
RESUMABLE = ("learned",)


def checkpoint_path(out: Path, key: str, base: str) -> Path:
    return out / "alignments" / f"{key}.{base}.ckpt"


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def read_unit(path: Path, unit: Unit, spec: GridSpec, warn: bool = True) -> dict | None:
    """The stored record of `unit`, validated in full (records.py); None if absent, and (with a
    warning naming the file) if unreadable or damaged: the unit is then computed again. A folder
    (or anything but a file) at its name is refused in one line: the record could not replace it."""
    import warnings

    from .records import check_record

    if path.exists() and not path.is_file():
        raise ValueError(f"{path}: is not a file, and a unit's record is stored there; move it away "
                         f"(or choose another --out)")
    try:
        return check_record(json.loads(path.read_text(encoding="utf-8")), unit, spec)
    except FileNotFoundError:
        return None
    except RecursionError:  # JSON nested too deeply to read
        exc = "nested too deeply to read"
        if warn:
            warnings.warn(f"{path}: damaged unit record ({exc}); computing the unit again", stacklevel=2)
        return None
    except (OSError, ValueError) as exc:  # (a decoding error is a ValueError)
        if warn:
            warnings.warn(f"{path}: damaged unit record ({exc}); computing the unit again", stacklevel=2)
        return None


class Runner:
    """One rank's view of a grid: its models, data and the units it computes."""

    def __init__(self, spec: GridSpec, out: Path, group: Group, resume: bool, log):
        self.spec, self.out, self.group, self.resume, self.log = spec, out, group, resume, log
        self.paths = model_paths(spec, out)
        self.models = ModelCache(self.paths, group.device)
        self._train_ds = self._test_ds = self._task_ds = None
        self._eval = self._match = None

    # ---- data: the datasets once, the batches on first use (a grid of finished units never makes them)
    def datasets(self):
        """The spec's (train, test) datasets as loaded: read before any model exists (a recipe's are
        trained after), so a bad data.spec fails first."""
        if self._train_ds is None:
            self._train_ds, self._test_ds = _data(self.spec)
        return self._train_ds, self._test_ds

    def task_datasets(self):
        """The datasets as the models read them (masked-token models: masked blocks); needs the first model."""
        if self._task_ds is None:
            from ..data.masked import for_task
            from ..models.adapters import adapter_for
            from ..sweep.metrics import task_of

            model = self.models.get(0)
            task = task_of(adapter_for(model).arch(model))
            self._task_ds = tuple(for_task(ds, task) for ds in self.datasets())
        return self._task_ds

    def eval_batches(self) -> list:
        if self._eval is None:
            train_ds, test_ds = self.task_datasets()
            ds = test_ds if self.spec.split == "test" else train_ds
            self._eval = _batches(ds, self.spec.batch_size, False, self.spec.max_batches, self.group.device)
        return self._eval

    def match_batches(self) -> list:
        if self._match is None:
            train_ds, _ = self.task_datasets()
            self._match = _batches(train_ds, self.spec.match_batch_size, True, self.spec.match_max_batches,
                                   self.group.device)
        return self._match

    # ---- one unit
    def _alignment(self, method: str, key: str, a, b, seconds: dict):
        """Column `method`'s alignment of b onto a (stored as alignments/<key>): the stored file when resuming
        and it fits these models, else solved and stored. Always the one read back from the file, so a
        resumed run applies exactly what a fresh one does."""
        from ..match.align import align_with
        from ..symmetry import Alignment

        base = self.spec.base(method)
        path = self.out / "alignments" / f"{key}.safetensors"
        reused = False
        if self.resume and path.exists():
            try:
                al = Alignment.load(path)
                al.verify_models(a, b)
                reused = True
            except ValueError:
                reused = False  # unreadable or made for other weights: solve again
        if not reused:
            t0 = time.perf_counter()
            opts = _align_options(base, self.spec.options.get(method, {}))
            data = self.match_batches() if REGISTRY[base].needs_data else None
            ckpt = checkpoint_path(self.out, key, base) if base in RESUMABLE else None
            if ckpt is not None:
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                opts["checkpoint"] = ckpt
            try:
                al = align_with(base, a, b, data, **opts)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"methods.{method}: {' '.join(str(exc).split())}") from exc
            seconds["solve"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            path.parent.mkdir(parents=True, exist_ok=True)
            al.save(path)
            if ckpt is not None:  # the alignment is stored: its solve's state is no longer needed
                ckpt.unlink(missing_ok=True)
            al = Alignment.load(path)
            seconds["write"] += time.perf_counter() - t0
        return al, reused, path

    def compute(self, unit: Unit) -> dict:
        return self.compute_simplex(unit) if unit.kind == "simplex" else self.compute_pair(unit)

    def compute_simplex(self, unit: Unit) -> dict:
        """The group's centroid and Dirichlet mixtures after aligning every other model to the first."""
        from ..sweep.evaluate import EvalOptions  # noqa: F401 - torch loaded here, as in compute_pair
        from ..sweep.simplex import simplex

        seconds = {"load": 0.0, "solve": 0.0, "canonicalise": 0.0, "sweep": 0.0, "write": 0.0}
        t0 = time.perf_counter()
        models = [self.models.get(k) for k in unit.models]
        seconds["load"] = time.perf_counter() - t0
        m = REGISTRY[self.spec.base(unit.method)]
        aligned, infos, reused, paths = [models[0]], [], [], []
        for model, key in zip(models[1:], unit.alignment_keys):
            if not m.aligns:
                aligned.append(model)
                continue
            al, was_reused, path = self._alignment(unit.method, key, models[0], model, seconds)
            t0 = time.perf_counter()
            aligned.append(al.apply(model))
            seconds["canonicalise"] += time.perf_counter() - t0
            infos.append(_jsonable(al.info))
            reused.append(was_reused)
            paths.append(str(path.relative_to(self.out)))
        batches = self.eval_batches()
        t0 = time.perf_counter()
        sweep_dir = sweep_path(self.out, unit)
        if not self.resume:
            shutil.rmtree(sweep_dir, ignore_errors=True)
        res = simplex(aligned, batches, n=self.spec.simplex_samples, alpha=self.spec.simplex_alpha,
                      seed=self.spec.simplex_seed, space=m.space, distributed=False, checkpoint=sweep_dir)
        seconds["sweep"] = time.perf_counter() - t0
        c = res["centroid"]
        return {"kind": "simplex", "unit": unit.index, "key": unit.key, "models": list(unit.models),
                "paths": [self.paths[k] for k in unit.models], "method": unit.method,
                "options": self.spec.options.get(unit.method, {}), "space": m.space, "data": self.spec.data,
                "split": self.spec.split, "examples": sum(len(y) for _, y in batches),
                "centroid": c["excess"], "centroid_loss": c["loss"], "centroid_acc": c["acc"],
                "centroid_acc_drop": c["acc_drop"], "worst": res["worst"]["excess"] if res["worst"] else None,
                "samples": self.spec.simplex_samples, "alpha": self.spec.simplex_alpha, "simplex": _jsonable(res),
                "info": infos, "alignments": paths, "alignment_reused": reused, "seconds": seconds,
                "rank": self.group.rank,
                "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}

    def compute_pair(self, unit: Unit) -> dict:
        from ..sweep.barrier import barrier_with
        from ..sweep.evaluate import EvalOptions

        seconds = {"load": 0.0, "solve": 0.0, "canonicalise": 0.0, "sweep": 0.0, "write": 0.0}
        on_cuda = _reset_peak_memory(self.group.device)
        t0 = time.perf_counter()
        i, j = unit.pair
        a, b = self.models.get(i), self.models.get(j)
        seconds["load"] = time.perf_counter() - t0
        m = REGISTRY[self.spec.base(unit.method)]
        al, reused, al_path = (None, False, None)
        if m.aligns:
            al, reused, al_path = self._alignment(unit.method, unit.alignment_key, a, b, seconds)
            t0 = time.perf_counter()
            b = al.apply(b)
            seconds["canonicalise"] = time.perf_counter() - t0
        batches = self.eval_batches()
        t0 = time.perf_counter()
        # distributed=False: the ranks run different units, so no sweep may wait for the others;
        # max_memory None: the device's free memory, the mixtures split into blocks that fit
        plan: dict = {}
        # the sweep records its progress under sweeps/<unit key>/ (resume.py): a killed unit's sweep
        # continues from its last record; a fresh run (resume=False) starts it afresh
        sweep_dir = sweep_path(self.out, unit)
        if not self.resume:
            shutil.rmtree(sweep_dir, ignore_errors=True)
        res = barrier_with(a, b, batches, list(self.spec.lambdas), m.space,
                           EvalOptions(device=self.group.device, distributed=False, report=plan,
                                       checkpoint=sweep_dir))
        seconds["sweep"] = time.perf_counter() - t0
        mid = res.at(0.5)
        record = {"unit": unit.index, "key": unit.key, "pair": list(unit.pair), "a": self.paths[i],
                  "b": self.paths[j], "method": unit.method, "options": self.spec.options.get(unit.method, {}),
                  "space": m.space, "data": self.spec.data, "split": self.spec.split,
                  "examples": sum(len(y) for _, y in batches), "barrier": res.barrier,
                  "acc_barrier": res.acc_barrier, "loss_mid": mid["loss"], "acc_mid": mid["acc"],
                  "curve": res.to_dict(), "info": _jsonable(al.info) if al is not None else {},
                  "alignment": str(al_path.relative_to(self.out)) if al_path is not None else None,
                  "alignment_reused": reused, "seconds": seconds,
                  "memory": _peak_memory(on_cuda, self.group.device, plan), "rank": self.group.rank,
                  "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        return record


def _reset_peak_memory(device) -> bool:
    """Start counting this unit's peak CUDA memory; False on other devices (nothing to count)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return False
    torch.cuda.reset_peak_memory_stats(device)
    return True


def _peak_memory(on_cuda: bool, device, plan: dict) -> dict:
    """The unit's peak memory and what it is: on CUDA the allocator's peak over the whole unit
    (solve and sweep); elsewhere the sweep's planned bytes (an estimate: CPU has no allocator peak)."""
    import torch

    out = {"mixtures_per_block": plan.get("mixtures_per_block"), "blocks": plan.get("blocks"),
           "planned_bytes": plan.get("planned_bytes")}
    if on_cuda:
        return {"peak_bytes": torch.cuda.max_memory_allocated(torch.device(device)),
                "source": "torch.cuda.max_memory_allocated", **out}
    return {"peak_bytes": plan.get("planned_bytes"), "source": "planned (sweep estimate)", **out}


def _unit_path(out: Path, unit: Unit) -> Path:
    return out / "units" / f"{unit.key}.json"


def sweep_path(out: Path, unit: Unit) -> Path:
    """The folder of the unit's sweep records (removed once the unit is stored)."""
    return out / "sweeps" / unit.key


def trace_name(unit: Unit) -> str:
    return f"unit{unit.index}-{unit.method}.json"


_TRACE_NAME = re.compile(r"unit\d+-[A-Za-z0-9_-]+\.json")


def _is_trace(path: Path) -> bool:
    """Whether `path` is a file torch.profiler's Chrome trace export wrote (a JSON object of traceEvents)."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and b'"traceEvents"' in head


def _check_profile_folder(profile) -> None:
    """A file at a trace's name in the --profile folder that no profiler wrote (the user's) is never
    overwritten: refused in one line before any unit."""
    folder = Path(profile)
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if _TRACE_NAME.fullmatch(entry.name) and not _is_trace(entry):
            raise ValueError(f"--profile {profile}: {entry.name} is there and is not a trace a grid wrote; "
                             f"not overwriting it (move it, or choose another folder)")


def _profiled(fn, folder: Path, unit: Unit):
    """fn() under torch.profiler; its Chrome trace -> folder/unit<index>-<method>.json (written atomically)."""
    from torch.profiler import ProfilerActivity, profile

    import torch

    from ..atomic import atomic_file

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, record_shapes=True) as prof:
        result = fn()
    with atomic_file(folder / trace_name(unit)) as tmp:
        prof.export_chrome_trace(str(tmp))
    return result


#: the folders a grid owns under its output folder (their files are named by unit keys; sweeps/ is removed)
OWNED_FOLDERS = ("units", "alignments", "sweeps", "models")


def check_outputs(spec: GridSpec, out: Path, inputs=(), profile=None) -> None:
    """Before any work, one line (ValueError) when the grid would write over something it must
    not: an input (the spec file, the [data] file or folder, a model) that is one of its outputs,
    inside a folder it owns or holding the output folder; a file at one of its report names that
    a grid did not write; an output folder that is a file; a recipe's model folder holding something a grid
    did not train."""
    from ..data_specs import data_paths
    from .report import REPORT_FILES, foreign_report_file

    from ..atomic import check_writable

    ins = [Path(p) for p in inputs] + data_paths(spec.data) + [Path(p) for p in spec.models]
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    check_writable(out / "grid.json", "--out")
    real_out = out.resolve()
    # models/ only where the grid trains its models there (given paths may well point into it)
    owned = [real_out / name for name in OWNED_FOLDERS if name != "models" or not spec.models]
    files = [real_out / name for name in REPORT_FILES]
    for src in ins:
        real = src.resolve()
        if real == real_out or real in real_out.parents:
            raise ValueError(f"--out {out}: is the input {src} or inside it; choose another output folder")
        if real in files:
            raise ValueError(f"input {src} is the grid's output {real.name} in {out}; choose another --out")
        for folder in owned:
            if real == folder or folder in real.parents:
                raise ValueError(f"input {src} is inside {folder.name}/ of {out}, which the grid writes; "
                                 f"choose another --out")
    if profile is not None:
        trace = Path(profile).resolve()
        if trace in files or any(trace == f or f in trace.parents for f in owned):
            raise ValueError(f"--profile {profile}: inside the grid's own outputs in {out}; choose another folder")
        if Path(profile).exists() and not Path(profile).is_dir():
            raise ValueError(f"--profile {profile}: exists and is not a folder (the trace is written into a folder)")
        check_writable(Path(profile) / "trace.json", "--profile")
        if any(trace == src.resolve() or src.resolve() in trace.parents for src in ins):
            raise ValueError(f"--profile {profile}: is an input or inside one; choose another folder")
        _check_profile_folder(profile)
    for name in REPORT_FILES:
        if foreign_report_file(out / name):
            raise ValueError(f"{out / name}: exists and was not written by a grid; not overwriting it "
                             f"(move it, or choose another --out)")
    check_model_folders(spec, out)  # a recipe's checkpoints are written into OUT/models/seedN


def run(spec, out, *, resume: bool = True, quiet: bool = False, log=None, profile=None, inputs=()) -> dict:
    """Run grid `spec` (a GridSpec, a spec dict, or a TOML path) into folder `out`.

    Returns {"records": [...], "summary": [...], "computed": units computed by this process,
    "reused": units found finished, "rank", "world"}; records/summary only on rank 0 (else empty).
    `profile`: a folder for a torch.profiler Chrome trace of one unit rank 0 computes (its first aligning one).
    `inputs`: more paths the grid reads and must never write (the CLI's spec file); a spec given as a
    path is one. Every output is checked against them before any work (`check_outputs`)."""
    from ..atomic import write_json
    from .report import write_reports

    if isinstance(spec, (str, Path)):
        inputs = (*inputs, spec)
    spec = _as_spec(spec)
    out = Path(out)
    check_outputs(spec, out, inputs, profile)
    spec = with_block_size(spec)  # the models' context, before any unit
    from ..paths import print_line

    say = log or (lambda msg: None if quiet else print_line(msg))
    with process_group(spec.device) as group:
        def rank_say(msg):
            say(msg if group.world == 1 else f"[rank {group.rank}] {msg}")

        out.mkdir(parents=True, exist_ok=True)
        runner = Runner(spec, out, group, resume, rank_say)
        runner.datasets()  # a bad data.spec fails now, not after training the models
        train_recipe_models(spec, out, group, rank_say)
        t0 = time.perf_counter()
        fingerprints = runner.models.fingerprints()
        load_seconds = time.perf_counter() - t0
        units = make_units(spec, fingerprints)
        pending = [u for u in units if not (resume and read_unit(_unit_path(out, u), u, spec, warn=group.is_main))]
        group.barrier()  # every rank has listed the pending units before any rank writes one
        mine = my_units(pending, group.rank, group.world)
        groups = (f" + {len(spec.simplex_groups)} simplex groups x {len(spec.simplex_methods)} methods"
                  if spec.simplex_groups else "")
        rank_say(f"{len(units)} units ({len(spec.pairs)} pairs x {len(spec.methods)} methods{groups}): "
                 f"{len(units) - len(pending)} finished before, {len(mine)} to compute here "
                 f"(models fingerprinted in {load_seconds:.1f} s)")
        # the profiled unit: rank 0's first that solves an alignment (the most phases), else its first
        traced = next((n for n, u in enumerate(mine) if REGISTRY[spec.base(u.method)].aligns), 0)
        for n, unit in enumerate(mine):
            compute = lambda u=unit: runner.compute(u)  # noqa: E731
            if profile is not None and n == traced and group.is_main:
                record = _profiled(compute, Path(profile), unit)
            else:
                record = compute()
            write_json(_unit_path(out, unit), record)
            shutil.rmtree(sweep_path(out, unit), ignore_errors=True)  # the unit is stored: its records are done
            s = record["seconds"]
            if unit.kind == "simplex":
                what = (f"models {tuple(unit.models)} {unit.method}: centroid excess loss {record['centroid']:.4f}, "
                        f"acc {record['centroid_acc']:.3f}")
            else:
                what = (f"pair {tuple(unit.pair)} {unit.method}: barrier {record['barrier']:.4f}, "
                        f"acc at 0.5 {record['acc_mid']:.3f}")
            rank_say(f"[{n + 1}/{len(mine)}] {what} (solve {s['solve']:.1f} s, sweep {s['sweep']:.1f} s)")
        group.barrier()  # every unit file is written
        result = {"records": [], "summary": [], "computed": len(mine), "reused": len(units) - len(pending),
                  "rank": group.rank, "world": group.world}
        if group.is_main:
            records = []
            for unit in units:
                record = read_unit(_unit_path(out, unit), unit, spec)
                if record is None:
                    raise RuntimeError(f"unit {unit.index} ({unit.method} on pair {unit.pair}) has no result file")
                # the stored record may come from an equal unit of another grid (same weights, other paths)
                # (its options too: a method that aligns nothing has none in its key)
                options = _jsonable(spec.options.get(unit.method, {}))
                if unit.kind == "simplex":
                    record.update(unit=unit.index, models=list(unit.models),
                                  paths=[runner.paths[k] for k in unit.models], method=unit.method, options=options)
                else:
                    record.update(unit=unit.index, pair=list(unit.pair), a=runner.paths[unit.pair[0]],
                                  b=runner.paths[unit.pair[1]], method=unit.method, options=options)
                records.append(record)
            result["records"] = records
            result["summary"] = write_reports(records, spec, out)
            if spec.simplex_groups:
                from .report import SIMPLEX_QUANTITIES, summarise

                result["simplex_summary"] = summarise(records, spec.simplex_methods, SIMPLEX_QUANTITIES)
            write_json(out / "grid.json", {"kind": "grid", "units": len(units),
                                           "world": group.world, "models": runner.paths,
                                           "fingerprints": fingerprints, "methods": list(spec.methods),
                                           "pairs": [list(p) for p in spec.pairs], "lambdas": list(spec.lambdas),
                                           "simplex_groups": [list(g) for g in spec.simplex_groups],
                                           "simplex_methods": list(spec.simplex_methods),
                                           "data": spec.data, "split": spec.split})
            say(f"{len(records)} records -> {out / 'results.jsonl'}")
        group.barrier()  # no rank leaves (and tears the group down) while rank 0 still writes
    return result


__all__ = ["OWNED_FOLDERS", "Runner", "check_outputs", "read_unit", "run"]
