"""Learned matching: optimisation steps per second, ours vs the straightforward version.

Baseline ("as published code does"): every step projects each group on its own, on the
host: scipy's linear_sum_assignment per permutation latent, torch.linalg.svd per orthogonal
latent, layer after layer. Ours: latents of one kind stacked across layers, one batched
assignment and one batched SVD per kind through lmc_fast.kernels (C++ / CUDA where built).
Both then run the same forward/backward on the same batch with the same number of mixing
weights, so the ratio isolates the projection path. Random weights at the paper's ViT size
(the step cost does not depend on what the weights are).

    python bench/bench_learned.py [--device cuda] [--steps 10] [--batch 16]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import record, write_results  # noqa: E402

import lmc_fast as lf  # noqa: E402
from lmc_fast.host_syncs import host_syncs  # noqa: E402
from lmc_fast.kernels.reference import linear_assignment_reference, polar_reference  # noqa: E402
from lmc_fast.match import projection  # noqa: E402
from lmc_fast.match.kinds.heads import HeadsLatent  # noqa: E402
from lmc_fast.match.kinds.orthogonal import OrthogonalLatent  # noqa: E402
from lmc_fast.match.kinds.permutation import PermutationLatent  # noqa: E402
from lmc_fast.match.learned import _mix  # noqa: E402
from lmc_fast.match.projection import Latents, apply_dense  # noqa: E402
from lmc_fast.models.adapters import standard_params  # noqa: E402
from lmc_fast.models import functional as Fn  # noqa: E402
from lmc_fast.sweep.metrics import task_loss  # noqa: E402
from lmc_fast.symmetry import canonical_params, canonical_spec  # noqa: E402


class PerGroupLatents(Latents):
    """The straightforward projection: one host solver call per group and per layer (the same
    latents and the same straight-through gradients as ours, solved one at a time)."""

    def project(self):
        dense, hard = {}, {}
        for blk in self.blocks.values():
            if isinstance(blk, PermutationLatent):
                for i, n in enumerate(blk.names):
                    P, perm = _perm_ste_one(blk.perm[i])
                    dense[n], hard[n] = {"P": P}, {"perm": perm}
            elif isinstance(blk, HeadsLatent):
                if blk.rotary_dim or blk.grouped:
                    raise NotImplementedError("the per-group baseline covers the ViT's heads (no RoPE, no GQA)")
                for i, n in enumerate(blk.names):
                    P, perm = _perm_ste_one(blk.perm[i])
                    maps = [blk.maps[i, j] for j in range(2)]
                    if blk.head_map == "orthogonal":
                        maps = [torch.stack([_polar_ste_one(M[h]) for h in range(M.shape[0])]) for M in maps]
                    dense[n] = {"P": P, "qk": maps[0], "vo": maps[1]}
                    hard[n] = {"perm": perm, "qk": maps[0].detach().double(), "vo": maps[1].detach().double()}
            elif isinstance(blk, OrthogonalLatent):
                R = _polar_ste_one(blk.rotation)
                if blk.centred:
                    R = blk.Q @ torch.block_diag(torch.ones(1, 1, dtype=R.dtype, device=R.device), R) @ blk.Q.T
                dense[blk.names[0]], hard[blk.names[0]] = {"R": R}, {"matrix": R.detach().double()}
            else:
                raise NotImplementedError(f"no per-group baseline for {type(blk).__name__}")
        return dense, hard


def _perm_ste_one(lat):
    perm = linear_assignment_reference(lat.detach().cpu()).to(lat.device)
    P = torch.zeros_like(lat).scatter_(-1, perm.unsqueeze(-1), 1.0)
    return P + (lat - lat.detach()), perm


def _polar_ste_one(M):
    exact = polar_reference(M.detach())
    S = torch.linalg.svdvals(M.detach())
    soft = projection.newton_schulz_polar(M, S[0])
    return exact + (soft - soft.detach())


def projection_difference(spec, init, device) -> dict:
    """How far the baseline's projection of the same latents is from ours: permutations must
    be equal; maps (float32, different polar routines) agree to rounding."""
    h0 = Latents(spec, init).to(device).project()[1]
    h1 = PerGroupLatents(spec, init).to(device).project()[1]
    perms_equal = all(torch.equal(h0[n][k].cpu(), h1[n][k].cpu()) for n in h0 for k in h0[n] if "perm" in k)
    map_err = max((float((h0[n][k].double().cpu() - h1[n][k].double().cpu()).abs().max()) for n in h0 for k in h0[n]
                   if "perm" not in k), default=0.0)
    return {"permutations_equal": perms_equal, "max_map_abs_diff": map_err, "same": perms_equal and map_err < 1e-4}


def paper_vit_case(device, batch: int, wm_iter: int = 2):
    """Two random paper ViTs in canonical form (float32 on `device`), weight matching's elements as
    the latents' start, and a random batch: (spec, pa, pb, init, x, y)."""
    from lmc_fast.match.weight import weight_matching

    torch.manual_seed(0)
    a, b = lf.models.ViT(lf.models.ViTConfig.paper()), lf.models.ViT(lf.models.ViTConfig.paper())
    arch, ra = standard_params(a)
    _, rb = standard_params(b)
    spec = canonical_spec(arch)
    pa64, pb64 = canonical_params(arch, ra), canonical_params(arch, rb)
    init, _ = weight_matching(spec, pa64, pb64, max_iter=wm_iter, polish_iter=0)
    pa = {k: v.to(device=device, dtype=torch.float32) for k, v in pa64.items()}
    pb = {k: v.to(device=device, dtype=torch.float32) for k, v in pb64.items()}
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    return spec, pa, pb, init, x, y


def make_step(latent_cls, spec, pa, pb, init, x, y, k, device):
    """One optimisation step of learned matching with `latent_cls`'s projection (a closure)."""
    lat = latent_cls(spec, init).to(device)
    opt = torch.optim.Adam(lat.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(0)  # on the device: drawing the weights waits for nothing

    def step():
        w = 0.4 + 0.2 * torch.rand(k, generator=gen, device=device)
        w = torch.stack([1 - w, w], 1)
        moved = apply_dense(spec, pb, lat.project()[0])
        theta = {name: _mix(w, [pa[name], moved[name]]) for name in pa}
        logits = Fn.forward(spec.arch, theta, x)
        loss = sum(task_loss(logits[i], y) for i in range(k)) / k
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def steps_per_second(latent_cls, spec, pa, pb, init, x, y, steps, k, device):
    step = make_step(latent_cls, spec, pa, pb, init, x, y, k, device)
    step()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return steps / (time.perf_counter() - t0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lambdas", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None, help="directory for the JSON (default bench/results/)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    spec, pa, pb, init, x, y = paper_vit_case(device, args.batch)
    base, ours = [], []
    for _ in range(args.repeat):  # interleaved, so drift hits both alike
        base.append(steps_per_second(PerGroupLatents, spec, pa, pb, init, x, y, args.steps, args.lambdas, device))
        ours.append(steps_per_second(Latents, spec, pa, pb, init, x, y, args.steps, args.lambdas, device))
    med = lambda v: sorted(v)[len(v) // 2]
    same = projection_difference(spec, init, device)
    syncs = {}
    if device.type == "cuda":
        for name, cls in (("baseline", PerGroupLatents), ("ours", Latents)):
            found = [" < ".join(site[:3]) for site in host_syncs(make_step(cls, spec, pa, pb, init, x, y, args.lambdas,
                                                                         device), match=("lmc_fast", "bench"))]
            sites = {site: found.count(site) for site in sorted(set(found))}
            syncs[name] = {"count": len(found), "call_sites": sites}
            print(f"{name}: {len(found)} synchronising operations per step, at {sites}")
    rec = record("learned_matching_steps", device=device, dtype="float32",
                 sizes={"model": "ViT.paper", "batch": args.batch, "lambdas_per_step": args.lambdas,
                        "steps": args.steps},
                 baseline="per-group host solvers (scipy LSA, torch.linalg.svd) every step",
                 baseline_s=1.0 / med(base), ours_s=1.0 / med(ours),
                 extra={"baseline_steps_per_s": med(base), "ours_steps_per_s": med(ours),
                        "projection_vs_baseline": same,
                        **({"host_syncs_per_step": syncs} if syncs else {})})
    path = write_results("learned", [rec], device, out=args.out)
    print(f"projection vs the baseline: {same}")
    print(f"steps/s: baseline {med(base):.2f}, ours {med(ours):.2f}, ratio {med(ours) / med(base):.2f}x -> {path}")


if __name__ == "__main__":
    main()
