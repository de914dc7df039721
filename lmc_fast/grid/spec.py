"""The grid's TOML spec -> a validated `GridSpec`; every mistake is one line naming its key.

    [data]
    spec = "digits"            # any --data value of the other commands
    split = "test"             # the split swept (default "test"); matching reads "train"
    block_size = 64            # text: tokens per block (default: the first model's training block, else
                               # min(64, the models' context), as the other commands)
    [models]
    paths = ["runs/seed0", "runs/seed1"]        # checkpoints or HF folders (relative to the working directory)
    # or: recipe = "vit-digits"; seeds = [0, 1, 2]; epochs = 5   (trained into OUT/models, cached)
    [grid]
    pairs = "all"              # "all" | "consecutive" | [[0, 1], [0, 2]]
    methods = ["none", "permutation", "weight", "activation", "learned"]
    lambdas = 11               # a count or a list of values in [0, 1]
    [methods.learned]          # per-method options, passed to lf.align
    steps = 300
    [methods.learned-perm]     # a variant: a new column, another method's options (`method` names it)
    method = "learned"
    learn = "permutations"
    [simplex]                  # optional: the centroid of each group of models, after aligning the
    groups = [[0, 1, 2]]       # others to its first with each method (the pairs' alignments are reused)
    methods = ["none", "weight"]  # default: [grid] methods
    samples = 16               # Dirichlet(alpha) draws besides the centroid
    alpha = 1.0

A bad spec fails here, before any model is loaded or trained.
"""
from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

from ..match.methods import METHODS, REGISTRY
from ..match.options import check_option
from ..recipe_names import RECIPE_DATA  # the default [data] spec when [models] names a recipe

MAX_LAMBDAS = 10_001  # as lmc_fast.sweep.barrier.MAX_LAMBDAS (not imported: that loads torch)

_KEYS = {
    "": {"data", "models", "grid", "methods", "simplex"},
    "data": {"spec", "split", "batch_size", "max_batches", "match_batch_size", "match_max_batches", "block_size"},
    "models": {"paths", "recipe", "seeds", "epochs", "steps"},
    "grid": {"pairs", "methods", "lambdas", "device"},
    "simplex": {"groups", "methods", "samples", "alpha", "seed"},
}
MAX_SIMPLEX_SAMPLES = 100_000  # as lmc_fast.sweep.simplex.MAX_SAMPLES
# Sizes past which a spec is a typo (a range pasted as seeds), refused before anything is built from it:
MAX_PAIRS = 100_000  # pairs of one grid (each is a unit per method: past this it is a typo)
#: models of one grid: each is trained (a recipe) or read and fingerprinted before the first unit
MAX_MODELS = 10_000
#: units of one grid (pairs x methods + simplex groups x their methods): each is a sweep and a file in units/,
#: all listed in memory before the first runs
MAX_UNITS = 100_000
#: models in one simplex group: every mixture of the sweep mixes all of them, held in memory together
MAX_GROUP_MODELS = 256
#: bytes of a spec file: a grid spec is a few lines (100,000 listed pairs take under 2 MB); it is read whole
MAX_SPEC_BYTES = 16 << 20


@dataclass(frozen=True)
class GridSpec:
    data: str
    models: tuple[str, ...] = ()  # checkpoint paths, or empty with `recipe`
    recipe: str | None = None
    seeds: tuple[int, ...] = ()
    train: dict = field(default_factory=dict)  # recipe overrides: epochs or steps
    pairs: tuple[tuple[int, int], ...] = ()
    methods: tuple[str, ...] = ("none", "weight")
    options: dict = field(default_factory=dict)  # method -> {option: value}
    bases: dict = field(default_factory=dict)  # variant name -> the registry method it runs
    lambdas: tuple[float, ...] = tuple(i / 10 for i in range(11))
    split: str = "test"
    batch_size: int = 256
    max_batches: int | None = None
    match_batch_size: int = 64
    match_max_batches: int | None = None
    block_size: int | None = None
    device: str = "cpu"
    simplex_groups: tuple[tuple[int, ...], ...] = ()  # model indices; the others aligned to the first
    simplex_methods: tuple[str, ...] = ()
    simplex_samples: int = 16
    simplex_alpha: float = 1.0
    simplex_seed: int = 0

    @property
    def n_models(self) -> int:
        return len(self.models) if self.models else len(self.seeds)

    def base(self, method: str) -> str:
        """The registry method a column runs: itself, or what its variant table names."""
        return self.bases.get(method, method)


def load_spec(path) -> GridSpec:
    """Read and validate a TOML spec file."""
    import tomllib

    path = Path(path)
    try:
        size = path.stat().st_size
        if path.is_file() and size > MAX_SPEC_BYTES:
            raise ValueError(f"{path}: {size} bytes, more than a grid spec's {MAX_SPEC_BYTES >> 20} MiB (a spec is a "
                             f"few lines; is it the right file?)")
        text = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such grid spec") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the grid spec ({exc.strerror or exc})") from None
    try:
        obj = tomllib.loads(text.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid TOML ({' '.join(str(exc).split())})") from None
    return parse_spec(obj)


def _table(obj: dict, name: str) -> dict:
    value = obj.get(name, {})
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be a table ([{name}]), got {_kind(value)}")
    return value


def _kind(value) -> str:
    return {list: "a list", dict: "a table", str: "a string", bool: "a boolean"}.get(type(value), type(value).__name__)


def _check_keys(table: dict, name: str) -> None:
    unknown = sorted(set(table) - _KEYS[name])
    if unknown:
        where = f"{name}.{unknown[0]}" if name else unknown[0]
        raise ValueError(f"{where}: unknown key; the keys of {f'[{name}]' if name else 'a spec'} are "
                         f"{', '.join(sorted(_KEYS[name]))}")


def _int(value, key: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}: must be an integer, got {_kind(value)} {value!r}")
    if value < low:
        raise ValueError(f"{key}: must be >= {low}, got {value}")
    return value


def _str(value, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key}: must be a non-empty string, got {_kind(value)} {value!r}")
    return value


def _lambdas(value) -> tuple[float, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 2 <= value <= MAX_LAMBDAS:
            raise ValueError(f"grid.lambdas: a count must be in [2, {MAX_LAMBDAS}], got {value}")
        return tuple(i / (value - 1) for i in range(value))
    if not isinstance(value, list) or not value or len(value) > MAX_LAMBDAS:
        raise ValueError(f"grid.lambdas: must be a count (>= 2) or a list of 1..{MAX_LAMBDAS} values in [0, 1]")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not 0 <= v <= 1:
            raise ValueError(f"grid.lambdas: values must be numbers in [0, 1], got {v!r}")
        out.append(float(v))
    return tuple(out)


def _pairs(value, n: int) -> tuple[tuple[int, int], ...]:
    if value == "all":
        if n * (n - 1) // 2 > MAX_PAIRS:  # counted, not built: a typo'd seed list must not fill the memory
            raise ValueError(f"grid.pairs: \"all\" of {n} models makes {n * (n - 1) // 2} pairs, more than "
                             f"{MAX_PAIRS} (each is a unit per method); list fewer models or the pairs")
        pairs = list(itertools.combinations(range(n), 2))
    elif value == "consecutive":
        pairs = [(i, i + 1) for i in range(n - 1)]
    elif isinstance(value, list) and value:
        if len(value) > MAX_PAIRS:
            raise ValueError(f"grid.pairs: {len(value)} pairs listed, more than {MAX_PAIRS} (each is a unit per "
                             f"method); list fewer")
        pairs = []
        for p in value:
            if (not isinstance(p, list) or len(p) != 2
                    or any(isinstance(i, bool) or not isinstance(i, int) for i in p)):
                raise ValueError(f"grid.pairs: each pair must be two model indices like [0, 1], got {p!r:.80}")
            for i in p:
                if not 0 <= i < n:
                    raise ValueError(f"grid.pairs: index {i} out of range for {n} models")
            if p[0] == p[1]:
                raise ValueError(f"grid.pairs: pair {p} joins a model to itself")
            pairs.append((p[0], p[1]))
        if len(set(pairs)) != len(pairs):
            raise ValueError("grid.pairs: a pair is listed twice")
    else:
        raise ValueError(f'grid.pairs: must be "all", "consecutive" or a list of [i, j], got {value!r:.80}')
    if not pairs:
        raise ValueError(f"grid.pairs: {value!r:.80} makes no pair of {n} model(s)")
    return tuple(pairs)


def _methods(value, bases: dict, key: str = "grid.methods") -> tuple[str, ...]:
    choices = ", ".join(list(METHODS) + list(bases))
    if not isinstance(value, list) or not value:
        raise ValueError(f"{key}: must be a non-empty list of {choices}")
    for m in value:
        if m not in REGISTRY and m not in bases:
            raise ValueError(f"{key}: unknown method {m!r}; choose from {choices} "
                             f"(or define a variant as [methods.NAME] with method = ...)")
    if len(set(value)) != len(value):
        raise ValueError(f"{key}: a method is listed twice")
    return tuple(value)


def _variant_base(name: str, opts: dict) -> str:
    """The registry method of table [methods.name]: the name itself, or its `method` key (a variant)."""
    if name in REGISTRY:
        if "method" in opts:
            raise ValueError(f"methods.{name}.method: only a variant (a new name) says which method it runs")
        return name
    base = opts.get("method")
    if base is None:
        raise ValueError(f"methods.{name}: unknown method; choose from {', '.join(METHODS)}, or make it a "
                         f"variant with method = \"learned\" (for example)")
    if base not in REGISTRY:
        raise ValueError(f"methods.{name}.method: unknown method {base!r}; choose from {', '.join(METHODS)}")
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"methods.{name}: a variant's name uses letters, digits, - and _ only")
    return base


def _options(table) -> tuple[dict, dict]:
    """([methods.*] tables) -> (name -> options, variant name -> registry method)."""
    if not isinstance(table, dict):
        raise ValueError(f"methods: must be tables like [methods.learned], got {_kind(table)}")
    out, bases = {}, {}
    for name, opts in table.items():
        if not isinstance(opts, dict):
            raise ValueError(f"methods.{name}: must be a table of options, got {_kind(opts)}")
        base = _variant_base(name, opts)
        if base != name:
            bases[name] = base
        allowed = REGISTRY[base].options
        opts = {k: v for k, v in opts.items() if k != "method"}
        for key, v in opts.items():
            if key not in allowed:
                raise ValueError(f"methods.{name}.{key}: unknown option" + (
                    f"; {base} takes {', '.join(allowed)}" if allowed else f"; {base} takes none"))
            if not isinstance(v, (bool, int, float, str)) or (isinstance(v, float) and not math.isfinite(v)):
                raise ValueError(f"methods.{name}.{key}: must be a finite number, a string or a boolean, got {v!r}")
            if key == "augment":
                from ..data_specs import AUGMENTATIONS  # the names of --augment (torch-free)

                if v not in AUGMENTATIONS:
                    raise ValueError(f"methods.{name}.augment: one of {', '.join(AUGMENTATIONS)}, got {v!r}")
            check_option(key, v, f"methods.{name}.{key}")  # the rule lf.align applies, before any unit runs
        from ..data_specs import check_augment_target

        check_augment_target(opts.get("augment"), opts.get("target"), f"methods.{name}.augment")
        out[name] = dict(sorted(opts.items()))
    return out, bases


def _simplex(table: dict, n: int, methods: tuple[str, ...], bases: dict, pairs=()) -> dict:
    if not table:
        return {}
    groups = table.get("groups")
    if not isinstance(groups, list) or not groups:
        raise ValueError("simplex.groups: must list groups of model indices like [[0, 1, 2]]")
    if len(groups) > MAX_UNITS:
        raise ValueError(f"simplex.groups: {len(groups)} groups, more than {MAX_UNITS} (a grid's units)")
    simplex_methods = _methods(table.get("methods", list(methods)), bases, "simplex.methods")
    # counted before a group is checked: (pairs, methods) are the grid's
    _check_unit_count({"pairs": pairs, "methods": methods, "simplex_groups": range(len(groups)),
                       "simplex_methods": simplex_methods})
    out = []
    for g in groups:
        if isinstance(g, list) and len(g) > MAX_GROUP_MODELS:
            raise ValueError(f"simplex.groups: a group of {len(g)} models, more than {MAX_GROUP_MODELS} (every "
                             f"mixture of its sweep mixes all of them, held in memory together)")
        if (not isinstance(g, list) or len(g) < 2
                or any(isinstance(i, bool) or not isinstance(i, int) for i in g)):
            raise ValueError(f"simplex.groups: each group must list two or more model indices, got {g!r:.80}")
        for i in g:
            if not 0 <= i < n:
                raise ValueError(f"simplex.groups: index {i} out of range for {n} models")
        if len(set(g)) != len(g):
            raise ValueError(f"simplex.groups: group {g} lists a model twice")
        out.append(tuple(g))
    if len(set(out)) != len(out):
        raise ValueError("simplex.groups: a group is listed twice")
    kw = {"simplex_groups": tuple(out), "simplex_methods": simplex_methods}
    if "samples" in table:
        kw["simplex_samples"] = _int(table["samples"], "simplex.samples", 0)
        if kw["simplex_samples"] > MAX_SIMPLEX_SAMPLES:
            raise ValueError(f"simplex.samples: at most {MAX_SIMPLEX_SAMPLES}, got {kw['simplex_samples']}")
    if "alpha" in table:
        a = table["alpha"]
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a <= 0:
            raise ValueError(f"simplex.alpha: must be a finite number > 0, got {a!r}")
        kw["simplex_alpha"] = float(a)
    if "seed" in table:
        kw["simplex_seed"] = _int(table["seed"], "simplex.seed", 0)
    return kw


def _models(table: dict) -> dict:
    paths, recipe = table.get("paths"), table.get("recipe")
    if (paths is None) == (recipe is None):
        raise ValueError("models: give either paths = [...] or recipe = NAME with seeds = [...]")
    if paths is not None:
        extra = sorted(set(table) & {"seeds", "epochs", "steps"})
        if extra:
            raise ValueError(f"models.{extra[0]}: only with models.recipe (the paths are trained already)")
        if not isinstance(paths, list) or len(paths) < 2:
            raise ValueError("models.paths: must list at least two checkpoints")
        _check_model_count(len(paths), "models.paths", "checkpoints")
        return {"models": tuple(_str(p, "models.paths") for p in paths)}
    if recipe not in RECIPE_DATA:
        raise ValueError(f"models.recipe: unknown recipe {recipe!r}; choose from {', '.join(RECIPE_DATA)}")
    seeds = table.get("seeds")
    if not isinstance(seeds, list) or len(seeds) < 2:
        raise ValueError("models.seeds: must list at least two seeds with models.recipe")
    _check_model_count(len(seeds), "models.seeds", "seeds")
    seeds = tuple(_int(s, "models.seeds", 0) for s in seeds)
    if len(set(seeds)) != len(seeds):
        raise ValueError("models.seeds: a seed is listed twice")
    if "epochs" in table and "steps" in table:
        raise ValueError("models.steps: give epochs or steps, not both")
    train = {}
    if "epochs" in table:
        e = table["epochs"]
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not math.isfinite(e) or e <= 0:
            raise ValueError(f"models.epochs: must be a positive number, got {e!r}")
        train["epochs"] = e
    if "steps" in table:
        train["steps"] = _int(table["steps"], "models.steps")
    return {"recipe": recipe, "seeds": seeds, "train": train}


def _check_model_count(n: int, key: str, what: str) -> None:
    if n > MAX_MODELS:
        raise ValueError(f"{key}: {n} {what}, more than {MAX_MODELS} (every model is trained or read and "
                         f"fingerprinted before the first unit; a list this long is a typo)")


def _check_unit_count(kw: dict) -> None:
    """pairs x methods + simplex groups x their methods, counted before any unit is listed."""
    pairs, groups = len(kw["pairs"]) * len(kw["methods"]), len(kw.get("simplex_groups", ())) * len(
        kw.get("simplex_methods", ()))
    if pairs + groups > MAX_UNITS:
        raise ValueError(f"grid: {len(kw['pairs'])} pairs x {len(kw['methods'])} methods"
                         + (f" + {len(kw['simplex_groups'])} simplex groups x {len(kw['simplex_methods'])} methods"
                            if groups else "")
                         + f" make {pairs + groups} units, more than {MAX_UNITS} (each is a sweep and a file in "
                           f"units/, all listed before the first runs); list fewer pairs, groups or methods")


def parse_spec(obj: dict) -> GridSpec:
    """A spec as a dict (what tomllib returns) -> GridSpec; ValueError naming the first bad key."""
    if not isinstance(obj, dict):
        raise ValueError(f"a grid spec must be a table, got {_kind(obj)}")
    _check_keys(obj, "")
    data, models, grid = _table(obj, "data"), _table(obj, "models"), _table(obj, "grid")
    simplex = _table(obj, "simplex")
    for name, table in (("data", data), ("models", models), ("grid", grid), ("simplex", simplex)):
        _check_keys(table, name)
    kw = _models(models)
    spec = data.get("spec", RECIPE_DATA.get(kw.get("recipe")))
    if spec is None:
        raise ValueError("data.spec: required (e.g. \"digits\", \"fashion-mnist:DIR\", \"text:PATH\")")
    kw["data"] = _str(spec, "data.spec")
    split = data.get("split", "test")
    if split not in ("test", "train"):
        raise ValueError(f"data.split: must be \"test\" or \"train\", got {split!r}")
    kw["split"] = split
    for key in ("batch_size", "match_batch_size", "max_batches", "match_max_batches", "block_size"):
        if key in data:
            kw[key] = _int(data[key], f"data.{key}")
    n = len(kw.get("models") or kw["seeds"])
    kw["options"], kw["bases"] = _options(obj.get("methods", {}))
    kw["methods"] = _methods(grid.get("methods", list(METHODS)), kw["bases"])
    pairs = grid.get("pairs", "all")
    # counted before a pair is built
    count = {"all": n * (n - 1) // 2, "consecutive": n - 1}.get(pairs, 0) if isinstance(pairs, str) else \
        len(pairs) if isinstance(pairs, list) else 0
    if count <= MAX_PAIRS:
        _check_unit_count({"pairs": range(count), "methods": kw["methods"]})
    kw["pairs"] = _pairs(pairs, n)
    if "lambdas" in grid:
        kw["lambdas"] = _lambdas(grid["lambdas"])
    device = grid.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"grid.device: must be \"cpu\" or \"cuda\" (under torchrun each rank takes its own GPU), "
                         f"got {device!r}")
    kw["device"] = device
    kw.update(_simplex(simplex, n, kw["methods"], kw["bases"], kw["pairs"]))
    return GridSpec(**kw)


__all__ = ["GridSpec", "load_spec", "parse_spec"]
