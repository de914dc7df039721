"""Learned matching as a trainable `nn.Module`, for the user's own loop, optimiser or Trainer.

    la = lf.LearnedAlignment(model_a, model_b)          # latents start at weight matching
    opt = torch.optim.Adam(la.parameters(), lr=3e-3)    # the parameters are the latents only
    for x, y in batches:
        loss = task_loss(la(x, lam=0.5), y)             # the interpolated, aligned model
        opt.zero_grad(); loss.backward(); opt.step()
    al = la.alignment()                                  # the hard Alignment (maps B onto A)
    merged_b = al.apply(model_b)

`MixedAlignments` is the N-model core that `learned_matching` and `learned_merge` train
(match/learned.py): one latent per symmetry group and model, projected to group elements with
straight-through gradients (projection.py), and a forward pass over the mixtures
theta = sum_n w_n g_n . theta_n of the models' (fixed) canonical parameters.
"""
from __future__ import annotations

import numbers
import reprlib

import torch

from ..models.adapters import standard_params
from ..models import functional as Fn
from ..sweep.checks import check_images, check_token_ids, spec_from_params
from ..symmetry import Alignment, canonical_spec, check_same_arch, model_fingerprint, prepare_params
from ..symmetry import elements as E
from .options import LEARN_MODES, SIDES
from .projection import Latents, apply_dense

def mix(w: torch.Tensor, tensors: list) -> torch.Tensor:
    """(K, N) weights, N tensors -> (K, ...) mixtures, as broadcast multiply-adds."""
    out = None
    for n, t in enumerate(tensors):
        term = w[:, n].reshape(-1, *([1] * t.dim())) * t
        out = term if out is None else out + term
    return out


def moved_from(al: Alignment, start: Alignment) -> dict:
    """How far `al` moved from `start`, per family of groups (the residual, "mlp", "heads", ...: the
    groups' name prefix) and element key, averaged over the family's layers (see `Alignment.distance`)."""
    sums: dict = {}
    for name, keys in al.distance(start).items():
        family = sums.setdefault(name.split(".")[0], {})
        for key, value in keys.items():
            family.setdefault(key, []).append(value)
    return {f: {k: sum(v) / len(v) for k, v in keys.items()} for f, keys in sums.items()}


def exact_alignment(spec, hard: dict, info: dict) -> Alignment:
    """The learned elements moved onto their groups in float64: the projections are only
    float32-accurate, and an alignment must pass validation (1e-10) and compose exactly. Validated here:
    no learned alignment leaves that its own `validate()` would refuse."""
    return Alignment(spec, {n: E.snap(g, hard[n]) for n, g in spec.groups.items()}, info).validate()


class MixedAlignments(torch.nn.Module):
    """Fixed parameters of N models (params_list[0] is the reference, never moved) and one
    `Latents` per other model, started at `init_elements`. Only the latents `learn` names
    require grad; the fixed parameters are non-persistent buffers (they follow `.to()`)."""

    def __init__(self, spec, params_list: list, init_elements: list, *, dtype=torch.float32, device="cpu",
                 learn: str = "all", sides: str = "b"):
        super().__init__()
        if learn not in LEARN_MODES:
            raise ValueError(f"learn must be one of {LEARN_MODES}, got {learn!r}")
        if sides not in SIDES:
            raise ValueError(f"sides must be one of {SIDES}, got {sides!r}")
        if len(init_elements) != len(params_list) - 1:
            raise ValueError(f"need one initial alignment per model after the first: got {len(init_elements)} "
                             f"for {len(params_list)} models")
        self.spec, self.arch, self.learn = spec, spec.arch, learn
        self.params_list = params_list  # float64 originals: validation sweeps and hard alignments use them
        self._names = list(params_list[0])
        for n, p in enumerate(params_list):
            for i, k in enumerate(self._names):
                self.register_buffer(f"fixed{n}_{i}", p[k].to(device=device, dtype=dtype), persistent=False)
        self.init_elements = init_elements  # where the latents started (`moved_from` reports the way travelled)
        self.latents = torch.nn.ModuleList([Latents(spec, el, dtype).to(device) for el in init_elements])
        # sides="both": the reference moves too, from the identity. The group acts linearly on the
        # parameters, so the path sum_n w_n g_n . theta_n is g_0 . (the path with g_0^-1 g_n): the same
        # paths as one side's, reached along other gradients (`hard_elements` reports g_0^-1 g_n)
        self.sides = sides
        self.reference = (Latents(spec, Alignment.identity(spec).elements, dtype).to(device) if sides == "both"
                          else None)
        for lat in self.all_latents():  # the latents `learn` leaves out stay at their initial solution
            for block_name, block in lat.blocks.items():
                for name, p in block.named_parameters():
                    p.requires_grad_(lat.trains(learn, block_name, name))

    def all_latents(self) -> list:
        """Every model's latents: the reference's first where it moves (sides="both")."""
        return ([] if self.reference is None else [self.reference]) + list(self.latents)

    @property
    def n_models(self) -> int:
        return len(self.params_list)

    def fixed_params(self) -> list[dict]:
        """The models' parameters as stored here (the module's dtype and device)."""
        return [{k: getattr(self, f"fixed{n}_{i}") for i, k in enumerate(self._names)} for n in range(self.n_models)]

    def mixed_params(self, weights: torch.Tensor) -> dict:
        """(K, N) mixing weights -> stacked parameters of the K mixtures of the aligned models,
        differentiable in the latents."""
        fixed = self.fixed_params()
        first = fixed[0] if self.reference is None else apply_dense(self.spec, fixed[0], self.reference.project()[0])
        moved = [first] + [apply_dense(self.spec, p, lat.project()[0]) for p, lat in zip(fixed[1:], self.latents)]
        return {k: mix(weights, [m[k] for m in moved]) for k in moved[0]}

    def mixture_logits(self, inputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Logits (K, B, ...) of the K mixtures on `inputs`."""
        return Fn.forward(self.arch, self.mixed_params(weights), inputs)

    def hard_elements(self) -> list[dict]:
        """The current group elements (one dict per model after the first, mapping it onto the
        first as it is stored), as projected now. Each projection also warm-starts the next one's
        assignment (see projection.py)."""
        with torch.no_grad():
            hard = [lat.project()[1] for lat in self.latents]
            if self.reference is None:
                return hard
            back = Alignment(self.spec, self.reference.project()[1]).inverse()
            return [back.compose(Alignment(self.spec, h)).elements for h in hard]

    def check_inputs(self, inputs) -> None:
        """One line when `inputs` do not fit the models (the checks the sweeps make): token ids
        outside the vocabulary or past the context, images of another shape or not finite."""
        if not isinstance(inputs, torch.Tensor):
            raise ValueError(f"inputs must be a tensor, got {type(inputs).__name__}")
        spec = spec_from_params(self.arch, self.params_list[0])
        (check_token_ids if spec.inputs == "tokens" else check_images)(spec, inputs)

    def forward(self, inputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        self.check_inputs(inputs)
        return self.mixture_logits(inputs, weights)


def _lam_weights(lam, dtype, device) -> tuple[torch.Tensor, bool]:
    """lam (a number, or K numbers) -> ((K, 2) weights (1 - lam, lam), whether lam was one number)."""
    if isinstance(lam, numbers.Real) and not isinstance(lam, bool):
        lam_t, single = torch.tensor([float(lam)], dtype=torch.float64), True
    else:
        try:  # strings, None, ragged lists: torch's TypeError or ValueError, as one line naming lam
            lam_t, single = torch.as_tensor(lam, dtype=torch.float64).detach().cpu(), False
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"lam must be a number or a 1-D list of numbers, got {reprlib.repr(lam)}") from None
        if lam_t.dim() != 1 or lam_t.numel() == 0:
            raise ValueError(f"lam must be a number or a 1-D list of numbers, got shape {tuple(lam_t.shape)}")
    if not torch.isfinite(lam_t).all():
        raise ValueError(f"lam must be finite, got {lam!r}")
    return torch.stack([1 - lam_t, lam_t], dim=1).to(device=device, dtype=dtype), single


class LearnedAlignment(MixedAlignments):
    """A trainable alignment of model_b onto model_a: its parameters are the learned-matching
    latents (one per symmetry group), initialised at `init` ("weight": weight matching,
    "identity", or an Alignment in canonical space). `forward(inputs, lam)` runs the model
    (1 - lam) theta_A + lam g . theta_B (lam a number: logits of that model; K numbers: logits
    with a leading K axis); `alignment()` returns the hard Alignment, which `apply(model_b)`
    like any other. `learn` ("all" | "continuous" | "residual" | "permutations" | "heads" | "mlp" | "no_residual") picks the latents
    that train; `sides="both"` trains A's elements too (from the identity; `alignment()` still maps B onto A).
    The two models are read once, here; they are neither trained nor held as submodules."""

    def __init__(self, model_a, model_b, init="weight", *, head_map: str = "orthogonal", learn: str = "all",
                 sides: str = "b", dtype=torch.float32, device=None, seed: int = 0):
        from ..models.adapters import adapter_for, check_compatible
        from ..models.resize import widen_mlp_to

        check_compatible(model_a, model_b)
        fingerprints = {"fingerprint_a": model_fingerprint(model_a), "fingerprint_b": model_fingerprint(model_b)}
        model_b_wide = widen_mlp_to(adapter_for(model_a).arch(model_a), model_b)  # a narrower B is zero-padded
        arch_a, raw_a = standard_params(model_a)
        arch_b, raw_b = standard_params(model_b_wide)
        check_same_arch(arch_a, arch_b, "model_b")
        spec = canonical_spec(arch_a, head_map)
        init_al, init_name = self._initial(init, spec, model_a, model_b_wide, seed)
        device = device if device is not None else next(model_a.parameters()).device
        super().__init__(spec, [prepare_params(spec, arch_a, raw_a), prepare_params(spec, arch_b, raw_b)],
                         [init_al.elements], dtype=dtype, device=device, learn=learn, sides=sides)
        self.init = init_name
        self._fingerprints = fingerprints
        self._model_b = (model_b,)  # in a tuple: not registered as a submodule, so its weights are not parameters

    @staticmethod
    def _initial(init, spec, model_a, model_b, seed: int):
        if isinstance(init, Alignment):
            if init.spec.space != "canonical":
                raise ValueError(f"init must be an alignment in canonical space (weight, activation or learned "
                                 f"matching), got one in {init.spec.space!r} space")
            check_same_arch(spec.arch, init.spec.arch, "init")
            if set(init.spec.groups) != set(spec.groups):
                raise ValueError("init was made with another head_map: its groups differ from this alignment's")
            return init.validate(), init.info.get("method", "given")
        if init == "weight":
            from .weight import align_by_weights

            return align_by_weights(model_a, model_b, seed=seed), "weight"
        if init == "identity":
            return Alignment.identity(spec), "identity"
        raise ValueError(f"init must be 'weight', 'identity' or an Alignment, got {init!r}")

    def forward(self, inputs: torch.Tensor, lam=0.5) -> torch.Tensor:
        self.check_inputs(inputs)
        p0 = self.fixed0_0
        weights, single = _lam_weights(lam, p0.dtype, p0.device)
        if inputs.is_floating_point():
            inputs = inputs.to(device=p0.device, dtype=p0.dtype)
        else:
            inputs = inputs.to(p0.device)
        logits = self.mixture_logits(inputs, weights)
        return logits[0] if single else logits

    def alignment(self, info: dict | None = None) -> Alignment:
        """The hard alignment the latents project to now, snapped exactly onto its groups."""
        meta = {"method": "learned", "init": self.init, "learn": self.learn, "sides": self.sides, **self._fingerprints,
                **(info or {})}
        return exact_alignment(self.spec, self.hard_elements()[0], meta)

    def aligned_model(self):
        """model_b with `alignment()` applied (a new model; model_b is untouched)."""
        return self.alignment().apply(self._model_b[0])


__all__ = ["LEARN_MODES", "LearnedAlignment", "MixedAlignments", "exact_alignment", "mix"]
