"""`Alignment`: a map group name -> element, with apply / inverse / compose / save / load."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, fields

import torch

from ..models.adapters import Arch, adapter_for, standard_params
from . import elements as E
from .canonical import canonical_params
from .elements import InvalidAlignmentError
from .fingerprint import model_fingerprint
from .spec import NO_HEAD_MAP, Spec, canonical_spec, permutation_spec

FORMAT = "lmc_fast.alignment/1"
_ARCH_KEYS = tuple(f.name for f in fields(Arch))  # every field: eps and activation change the function too
_HEADER_KEYS = ("format", "arch", "space", "head_map", "groups", "info")


class AlignmentMismatchError(ValueError):
    """The alignment was computed for other models than the ones it is applied to."""


def check_same_arch(expected: Arch, got: Arch, what: str = "model"):
    for key in _ARCH_KEYS:
        if getattr(expected, key) != getattr(got, key):
            raise ValueError(f"{what} does not fit: {key} is {getattr(got, key)!r}, expected {getattr(expected, key)!r}")


def spec_for(arch: Arch, space: str, head_map: str = "orthogonal", heads: bool = True) -> Spec:
    """`head_map` picks the canonical space's per-head maps; `heads` whether the raw space's
    permutation spec permutes whole heads (see permutation_spec)."""
    if space == "canonical":
        return canonical_spec(arch, head_map)
    if space == "raw":
        return permutation_spec(arch, heads=heads)
    raise ValueError(f"space must be 'canonical' or 'raw', got {space!r}")


def prepare_params(spec: Spec, arch: Arch, params: dict, dtype=torch.float64) -> dict:
    """Parameters in the space the spec acts on, in `dtype` (float64 unless asked otherwise)."""
    if spec.space == "canonical":
        return canonical_params(arch, params, dtype)
    return {k: v.detach().to(dtype, copy=True) for k, v in params.items()}


class Alignment:
    """Maps model B onto model A: `apply(model_b)` returns B transformed by every group's element."""

    def __init__(self, spec: Spec, elements: dict[str, E.Element], info: dict | None = None):
        missing = set(spec.groups) - set(elements)
        if missing:
            raise ValueError(f"alignment lacks elements for groups {sorted(missing)}")
        self.spec, self.elements, self.info = spec, elements, dict(info or {})

    # -------------------------------------------------------------- basics
    @classmethod
    def identity(cls, spec: Spec) -> "Alignment":
        return cls(spec, {n: E.identity(g) for n, g in spec.groups.items()})

    @classmethod
    def random(cls, spec: Spec, seed: int = 0) -> "Alignment":
        gen = torch.Generator().manual_seed(seed)
        return cls(spec, {n: E.random_element(g, gen) for n, g in spec.groups.items()})

    def __getitem__(self, name: str) -> E.Element:
        return self.elements[name]

    def __repr__(self):
        kinds = {}
        for g in self.spec.groups.values():
            kinds[g.kind] = kinds.get(g.kind, 0) + 1
        return f"Alignment({self.spec.arch.family}, space={self.spec.space}, groups={kinds})"

    # -------------------------------------------------------------- action
    def apply_params(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """g . params for standard parameters already in this alignment's space."""
        return E.apply_spec(self.spec, params, self.elements)

    def validate(self) -> "Alignment":
        """Raise InvalidAlignmentError unless every element belongs to its group (bijective
        permutations, orthogonal / well-conditioned maps of the right shapes); returns self."""
        for name, group in self.spec.groups.items():
            E.validate(group, self.elements[name])
        return self

    def verify_models(self, model_a, model_b, force: bool = False) -> bool:
        """Check that (model_a, model_b) are the models this alignment was computed for.

        Raises AlignmentMismatchError when a recorded fingerprint differs, unless `force`.
        Returns True when both fingerprints were recorded and match; an alignment without
        fingerprints (older files) passes, returning False, as does a forced mismatch."""
        recorded = (self.info.get("fingerprint_a"), self.info.get("fingerprint_b"))
        if recorded == (None, None):
            return False
        got = (model_fingerprint(model_a), model_fingerprint(model_b))
        if all(r is None or r == g for r, g in zip(recorded, got)):
            return None not in recorded
        if force:
            return False
        short = lambda pair: "/".join(str(x)[:12] if x is not None else "?" for x in pair)
        raise AlignmentMismatchError(f"alignment was made for models {short(recorded)}, got {short(got)}: "
                                     "pass --force to apply it anyway")

    def apply(self, model):
        """A model of the same class as `model` computing the same function, aligned. A model
        whose MLP is narrower than the reference's is zero-padded first (models/resize.py).
        The elements are validated first (a corrupt element would change the function)."""
        from ..models.resize import widen_mlp_to

        self.validate()
        model = widen_mlp_to(self.spec.arch, model, "model")
        arch, params = standard_params(model)
        check_same_arch(self.spec.arch, arch)
        new = self.apply_params(prepare_params(self.spec, arch, params))
        return adapter_for(model).build(model, new)

    def inverse(self) -> "Alignment":
        info = dict(self.info)
        # the inverse maps A onto B: the pair it was made for swaps roles
        fa, fb = info.pop("fingerprint_a", None), info.pop("fingerprint_b", None)
        info.update({k: v for k, v in (("fingerprint_a", fb), ("fingerprint_b", fa)) if v is not None})
        return Alignment(self.spec, {n: E.inverse(g, self.elements[n]) for n, g in self.spec.groups.items()}, info)

    def compose(self, other: "Alignment") -> "Alignment":
        """The alignment that applies `other` first, then `self`."""
        if other.spec.space != self.spec.space:
            raise ValueError("cannot compose alignments acting on different spaces")
        check_same_arch(self.spec.arch, other.spec.arch, "alignment")
        return Alignment(self.spec, {n: E.compose(g, self.elements[n], other.elements[n])
                                     for n, g in self.spec.groups.items()})

    def distance(self, start: "Alignment") -> dict:
        """How far each element moved from `start`'s (e.g. learned matching from its weight-matching
        init): {group: {key: value}}, permutations as the fraction of entries reassigned, maps as the
        relative Frobenius distance ||M - M_start||_F / ||M_start||_F (float64)."""
        if set(start.spec.groups) != set(self.spec.groups) or start.spec.space != self.spec.space:
            raise ValueError("distance: the alignments act on different groups or spaces")
        out = {}
        for n in self.spec.groups:
            out[n] = {}
            for key, t in self.elements[n].items():
                ref = start.elements[n].get(key)
                if ref is None or ref.shape != t.shape:
                    raise ValueError(f"distance: group {n!r} {key!r} has shape {tuple(t.shape)} here, "
                                     f"{None if ref is None else tuple(ref.shape)} in start")
                if t.is_floating_point():
                    a, b = t.to(torch.float64), ref.to(torch.float64)
                    out[n][key] = float((a - b).norm() / b.norm().clamp_min(1e-300))
                else:
                    out[n][key] = float((t != ref).double().mean()) if t.numel() else 0.0
        return out

    # -------------------------------------------------------------- files
    def save(self, path: str | os.PathLike):
        """safetensors file with a JSON header; written atomically (no half-written file). An element that
        is not a group member is refused before anything is written: `load` would refuse the file."""
        self.validate()
        self._write(path)

    def _write(self, path) -> None:
        """The file as it is, unchecked (tests write damaged files with it, as a disk would leave them)."""
        from safetensors.torch import save_file

        from ..atomic import atomic_file

        head_map = next((g.head_map for g in self.spec.groups.values() if g.kind == "heads"), "orthogonal")
        header = {"format": FORMAT, "arch": asdict(self.spec.arch), "space": self.spec.space,
                  "head_map": head_map, "groups": {n: g.kind for n, g in self.spec.groups.items()},
                  "info": _jsonable(self.info)}
        tensors = {f"{n}/{k}": v.detach().cpu().contiguous() for n, el in self.elements.items() for k, v in el.items()}
        with atomic_file(path) as tmp:
            save_file(tensors, str(tmp), metadata={"lmc_fast": json.dumps(header)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Alignment":
        """Read and validate an alignment file; any defect is one InvalidAlignmentError line."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"alignment file not found: {path}")
        try:
            meta, tensors = _read_safetensors(path)
            header = _parse_header(meta)
            arch = Arch.from_dict(header["arch"])
            _check_layer_count(arch, header, tensors)
            head_map = header.get("head_map", "orthogonal")
            # raw space: files with head permutations say head_map "none"; older ones have no heads groups
            spec = spec_for(arch, header["space"], head_map, heads=head_map == NO_HEAD_MAP)
            _check_groups(spec, header, tensors)
        except Exception as exc:  # safetensors / json / header errors all mean the same to a user
            raise InvalidAlignmentError(f"{path} is not a valid lmc_fast alignment file: {_one_line(exc)}") from exc
        elements = {name: {key: _stored(key, tensors[f"{name}/{key}"]) for key in E.expected_shapes(group)}
                    for name, group in spec.groups.items()}
        al = cls(spec, elements, header.get("info"))
        try:
            return al.validate()
        except InvalidAlignmentError as exc:
            raise InvalidAlignmentError(f"{path}: {exc}") from exc


# ------------------------------------------------------------------ reading files
def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_safetensors(path: str) -> tuple[dict, dict]:
    from safetensors import safe_open

    from ..paths import utf8_name

    with utf8_name(path) as name, safe_open(name, framework="pt") as f:  # safetensors takes UTF-8 names only
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return meta, tensors


def _parse_header(meta: dict) -> dict:
    if "lmc_fast" not in meta:
        raise ValueError("no lmc_fast header (a model checkpoint?)")
    try:
        header = json.loads(meta["lmc_fast"])
    except RecursionError:
        raise ValueError("header JSON is nested too deeply") from None
    if not isinstance(header, dict):
        raise ValueError(f"header must be a JSON object, got {type(header).__name__}")
    if header.get("format") != FORMAT:
        raise ValueError(f"unknown format {header.get('format')!r}")
    for key in ("arch", "space", "groups"):
        if key not in header:
            raise ValueError(f"header lacks {key!r}")
    unknown = sorted(set(header) - set(_HEADER_KEYS))
    if unknown:
        raise ValueError(f"unknown header keys {unknown}")
    if not isinstance(header.get("info", {}), dict):
        raise ValueError(f"header info must be an object, got {type(header['info']).__name__}")
    return header


def _layer_of(group_name: str) -> int | None:
    head, _, tail = group_name.partition(".")
    return int(tail) if head in ("mlp", "heads", "inner", "state") and tail.isdigit() else None  # Mamba: inner, state


def _check_layer_count(arch: Arch, header: dict, tensors: dict) -> None:
    """Before building a spec of arch.n_layer layers: the file must hold that many (a corrupt
    n_layer of a million would otherwise build a million groups)."""
    layers = {_layer_of(k.split("/")[0]) for k in tensors} - {None}
    if len(layers) != arch.n_layer:
        raise ValueError(f"header arch n_layer is {arch.n_layer}, but the file holds elements for {len(layers)} layers")


def _check_groups(spec: Spec, header: dict, tensors: dict) -> None:
    kinds = {n: g.kind for n, g in spec.groups.items()}
    if header["groups"] != kinds:
        raise ValueError("header groups do not match the architecture's symmetry groups")
    expected = {f"{n}/{k}" for n, g in spec.groups.items() for k in E.expected_shapes(g)}
    missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing:
        raise ValueError(f"missing tensors {missing[:5]}")
    if extra:
        raise ValueError(f"unexpected tensors {extra[:5]}")


def _stored(key: str, t: torch.Tensor) -> torch.Tensor:
    """Integer permutations as int64 (validation still sees a float-valued one as float)."""
    if key == "perm" and not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        return t.long()
    return t


def _jsonable(obj):
    try:
        json.dumps(obj)
        return obj
    except TypeError:
        return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
