"""`lmc-fast train`: train models from several seeds."""
from __future__ import annotations

from pathlib import Path

from .args import DATA_HELP, add_command, block_size_arg, finite_positive_float, nonnegative_int, positive_int
from .console import CLIError, Console, one_line
from ..data_specs import DEFAULT_BLOCK_SIZE
from .data import data_paths, load_data, split_spec
from .models import overridden, parse_overrides
from .outputs import Outputs, now


#: the reference models `train` builds: the keys of lmc_fast.models.adapters.REFERENCE (not imported
#: here: that loads torch; tests/test_methods_registry.py keeps the two equal)
MODEL_TYPES = ("vit", "gpt2", "llama", "neox", "bert")
#: the other REFERENCE models, and what trains them instead (not this command: its loop scores classes or tokens)
TRAINED_ELSEWHERE = {"dit": "lmc_fast.diffusion.train_dit (noise prediction)"}
#: the language models among them (they train on text), and those that learn masked tokens
TEXT_MODELS = ("gpt2", "llama", "neox", "bert")
MASKED_MODELS = ("bert",)


def register(subparsers, parents):
    t = add_command(subparsers, "train", "train models from several seeds", parents)
    t.add_argument("--model", choices=MODEL_TYPES, default="vit",
                   help="architecture (gpt2, llama, neox and bert train on text; bert on masked tokens)")
    t.add_argument("--data", required=True, help=DATA_HELP)
    t.add_argument("--seeds", type=nonnegative_int, nargs="+", default=[0], help="one model per seed")
    t.add_argument("--out", required=True, help="output folder (seed<N>/ per seed and train.json)")
    length = t.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=finite_positive_float, default=None,
                        help="training epochs (default: the recipe's, else 3 for a ViT)")
    length.add_argument("--steps", type=positive_int, default=None,
                        help="optimizer steps instead of epochs (default: the recipe's, else 1000 for text)")
    t.add_argument("--lr", type=finite_positive_float, default=None, help="peak learning rate (default: the recipe's)")
    t.add_argument("--batch-size", type=positive_int, default=None, help="batch size (default: the recipe's)")
    t.add_argument("--limit", type=positive_int, default=None,
                   help="use only the first N training examples (default: all)")
    t.add_argument("--block-size", type=block_size_arg, default=None, help="tokens per block for text (default 64)")
    t.add_argument("--config", nargs="+", metavar="KEY=VALUE",
                   help="model config overrides, e.g. d_model=32 n_layer=2 (default: the recipe's model)")


def run(args, con: Console) -> int:
    from ..io import save_model, write_json
    from ..train import train

    if len(set(args.seeds)) != len(args.seeds):
        raise CLIError(f"--seeds {' '.join(map(str, args.seeds))}: a seed is given twice")
    overrides = parse_overrides(args.config, args.model)
    out = Path(args.out)
    outputs = Outputs(data_paths(args.data))
    outputs.into("--out", out)
    seed_dirs = {seed: outputs.folder("--out", out / f"seed{seed}") for seed in args.seeds}
    outputs.file("--out", out / "train.json")
    outputs.check()

    from ..recipes import recipe

    name, _ = split_spec(args.data)
    if args.model == "vit" and name == "fashion-mnist" and args.limit is None and ":" not in args.data:
        train_ds, test_ds = recipe("vit-fashion-mnist").datasets()  # the recipe's measured 20k subset
    else:
        train_ds, test_ds = load_data(args.data, args.block_size or DEFAULT_BLOCK_SIZE, args.limit)
    if args.model in MASKED_MODELS:  # masked-token pretraining reads masked blocks (vocabulary + [MASK])
        from ..data.masked import for_task

        train_ds, test_ds = for_task(train_ds, "masked_token"), for_task(test_ds, "masked_token")
    rec, factory, cfg, hp, bs = _train_setup(args, train_ds, test_ds, overrides)
    con.log(f"training {len(args.seeds)} {args.model} model(s) on {args.data} ({len(train_ds)} train / "
            f"{len(test_ds)} test), {hp}, batch {bs}" + (f", recipe {rec}" if rec else ""))
    summary = {"kind": "train", "model": args.model, "data": args.data, "recipe": rec, "config": cfg.to_dict(),
               "hparams": hp, "batch_size": bs, "device": args.device, "runs": [], "date": now()}
    for seed in args.seeds:
        model = factory(seed).to(args.device)
        hist = train(model, train_ds, batch_size=bs, eval_data=test_ds, seed=seed, device=args.device,
                     progress=not args.quiet, **hp)
        model.eval()
        meta = {"data": args.data, "seed": seed, "recipe": rec, "hparams": hp, "batch_size": bs, "train": hist}
        if hasattr(train_ds, "block_size"):
            meta["block_size"] = train_ds.block_size
        # each model is written when it is done (a long run keeps what finished), all of its files or
        # none (save_model): a full disk leaves this seed's folder as it was, and the finished ones
        try:
            path = save_model(model, seed_dirs[seed], metadata=meta)
        except OSError as exc:
            _failed_write(exc, summary)
        ev = hist.get("eval", {})
        summary["runs"].append({"seed": seed, "path": str(path), **{k: hist[k] for k in ("steps", "seconds", "train_loss")},
                                "eval": ev})
        con.out(f"seed {seed}: {hist['steps']} steps, {hist['seconds']:.1f} s, test loss {ev.get('loss', float('nan')):.4f}, "
                f"test acc {ev.get('acc', float('nan')):.4f} -> {path}")
    try:
        write_json(out / "train.json", summary)
    except OSError as exc:
        _failed_write(exc, summary)
    return 0


def _failed_write(exc: OSError, summary: dict):
    """A write failed (a full disk): one line that also says which finished models are kept."""
    if not summary["runs"]:
        raise exc
    kept = ", ".join(r["path"] for r in summary["runs"])
    raise CLIError(f"{one_line(exc)} (the models finished before it are kept: {kept})") from None


def _train_setup(args, train_ds, test_ds, overrides: dict):
    """(recipe name or None, model factory(seed), config, hyper-parameters, batch size)."""
    import dataclasses

    from ..data.base import ImageDataset, TokenDataset
    from ..models import BertConfig, GPT2Config, LlamaConfig, NeoXConfig, ViTConfig
    from ..recipes import recipe

    name, _ = split_spec(args.data)
    overrides = dict(overrides)
    is_text = isinstance(train_ds, TokenDataset)
    if args.model in TEXT_MODELS and not is_text:
        raise CLIError(f"--model {args.model} needs text data (text:PATH or shakespeare), got {args.data!r}")
    if args.model == "vit" and not isinstance(train_ds, ImageDataset):
        raise CLIError(f"--model vit needs image data, got {args.data!r}")
    from ..recipe_names import recipe_for

    rec = recipe_for(args.model, name)
    if rec is not None:
        r = recipe(rec)
        cfg, hp, bs = r.model_config, dict(r.hparams), r.batch_size
        if is_text and train_ds.block_size != cfg.block_size:
            cfg = dataclasses.replace(cfg, block_size=train_ds.block_size)
    elif args.model == "vit":
        C, H, W = train_ds.image_shape
        if H != W:
            raise CLIError(f"ViT needs square images, got {H}x{W}")
        if (H, C) == (28, 1):
            cfg = ViTConfig.mnist()
        elif (H, C) == (32, 3):
            cfg = ViTConfig.paper()
        else:
            patch = next(p for p in (4, 2, 1) if H % p == 0)
            cfg = ViTConfig(image_size=H, patch_size=patch, channels=C, d_model=64, n_layer=4, n_head=4, d_mlp=128)
        cfg = dataclasses.replace(cfg, num_classes=train_ds.num_classes, channels=C, image_size=H)
        hp, bs = dict(epochs=3, lr=2e-3, weight_decay=0.05, warmup=0.1, label_smoothing=0.0), 128
    else:
        text = dict(vocab_size=train_ds.vocab_size, block_size=train_ds.block_size)
        cfg = {"llama": lambda: LlamaConfig(n_layer=2, d_model=64, n_head=4, n_kv_head=2, **text),
               "neox": lambda: NeoXConfig(n_layer=2, d_model=64, n_head=4, **text),
               "bert": lambda: BertConfig(n_layer=2, d_model=64, n_head=4, **text),
               "gpt2": lambda: GPT2Config(n_layer=2, n_embd=64, n_head=4, **text)}[args.model]()
        hp, bs = dict(steps=1000, lr=3e-3, weight_decay=0.05, warmup=0.05, label_smoothing=0.0), 32
    if is_text:
        cfg = dataclasses.replace(cfg, vocab_size=train_ds.vocab_size)
    from ..models.adapters import REFERENCE

    cls = REFERENCE[args.model][0]
    if overrides:
        if args.model == "gpt2" and "n_embd" in overrides and "d_mlp" not in overrides:
            overrides["d_mlp"] = 4 * overrides["n_embd"]
        if args.model in ("llama", "neox", "bert"):  # widths derived from d_model / n_head follow them unless given
            if "d_model" in overrides and "d_mlp" not in overrides:
                overrides["d_mlp"] = None
            heads_change = "d_model" in overrides or "n_head" in overrides
            if args.model == "llama" and heads_change and "head_dim" not in overrides:
                overrides["head_dim"] = None
        cfg = overridden(cls, cfg, overrides, args.config)
    if args.epochs is not None:
        hp.pop("steps", None)
        hp["epochs"] = args.epochs
    if args.steps is not None:
        hp.pop("epochs", None)
        hp["steps"] = args.steps
    if args.lr is not None:
        hp["lr"] = args.lr
    bs = args.batch_size or bs

    def factory(seed):
        from ..train import seed_everything

        seed_everything(seed)
        return cls(cfg)

    return rec, factory, cfg, hp, bs
