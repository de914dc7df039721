"""`Alignment`: a map group name -> element, with apply / inverse / compose / save / load."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, fields

import torch

from ..models.adapters import Arch, adapter_for, standard_params
from . import elements as E
from .canonical import canonical_params
from .spec import Spec, canonical_spec, permutation_spec

FORMAT = "lmc_fast.alignment/1"
_ARCH_KEYS = ("family", "n_layer", "d_model", "n_head", "d_mlp", "norm")


def check_same_arch(expected: Arch, got: Arch, what: str = "model"):
    for key in _ARCH_KEYS:
        if getattr(expected, key) != getattr(got, key):
            raise ValueError(f"{what} does not fit: {key} is {getattr(got, key)!r}, expected {getattr(expected, key)!r}")


def spec_for(arch: Arch, space: str, head_map: str = "orthogonal") -> Spec:
    if space == "canonical":
        return canonical_spec(arch, head_map)
    if space == "raw":
        return permutation_spec(arch)
    raise ValueError(f"space must be 'canonical' or 'raw', got {space!r}")


def prepare_params(spec: Spec, arch: Arch, params: dict) -> dict:
    """Float64 parameters in the space the spec acts on."""
    if spec.space == "canonical":
        return canonical_params(arch, params)
    return {k: v.detach().to(torch.float64) for k, v in params.items()}


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

    def apply(self, model):
        """A model of the same class as `model` computing the same function, aligned. A model
        whose MLP is narrower than the reference's is zero-padded first (models/resize.py)."""
        from ..models.resize import widen_mlp_to

        model = widen_mlp_to(self.spec.arch, model, "model")
        arch, params = standard_params(model)
        check_same_arch(self.spec.arch, arch)
        new = self.apply_params(prepare_params(self.spec, arch, params))
        return adapter_for(model).build(model, new)

    def inverse(self) -> "Alignment":
        return Alignment(self.spec, {n: E.inverse(g, self.elements[n]) for n, g in self.spec.groups.items()}, self.info)

    def compose(self, other: "Alignment") -> "Alignment":
        """The alignment that applies `other` first, then `self`."""
        if other.spec.space != self.spec.space:
            raise ValueError("cannot compose alignments acting on different spaces")
        check_same_arch(self.spec.arch, other.spec.arch, "alignment")
        return Alignment(self.spec, {n: E.compose(g, self.elements[n], other.elements[n])
                                     for n, g in self.spec.groups.items()})

    # -------------------------------------------------------------- files
    def save(self, path: str | os.PathLike):
        """safetensors file with a JSON header; written atomically (no half-written file)."""
        from safetensors.torch import save_file

        head_map = next((g.head_map for g in self.spec.groups.values() if g.kind == "heads"), "orthogonal")
        header = {"format": FORMAT, "arch": asdict(self.spec.arch), "space": self.spec.space,
                  "head_map": head_map, "groups": {n: g.kind for n, g in self.spec.groups.items()},
                  "info": _jsonable(self.info)}
        tensors = {f"{n}/{k}": v.detach().cpu().contiguous() for n, el in self.elements.items() for k, v in el.items()}
        path = os.fspath(path)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
        os.close(fd)
        try:
            save_file(tensors, tmp, metadata={"lmc_fast": json.dumps(header)})
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Alignment":
        from safetensors import safe_open

        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"alignment file not found: {path}")
        try:
            with safe_open(path, framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            header = json.loads(meta["lmc_fast"])
            if header.get("format") != FORMAT:
                raise ValueError(f"unknown format {header.get('format')!r}")
            arch = Arch(**{f.name: header["arch"][f.name] for f in fields(Arch)})
        except Exception as exc:  # safetensors / json / key errors all mean the same to a user
            raise ValueError(f"{path} is not a valid lmc_fast alignment file: {exc}") from exc
        spec = spec_for(arch, header["space"], header.get("head_map", "orthogonal"))
        elements = {}
        for name, group in spec.groups.items():
            ref = E.identity(group)
            el = {}
            for key, want in ref.items():
                t = tensors.get(f"{name}/{key}")
                if t is None or t.shape != want.shape:
                    raise ValueError(f"{path}: group {name!r} entry {key!r} is missing or has the wrong shape")
                el[key] = t
            elements[name] = el
        return cls(spec, elements, header.get("info"))


def _jsonable(obj):
    try:
        json.dumps(obj)
        return obj
    except TypeError:
        return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
