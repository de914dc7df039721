"""Streamed checkpoints run forward a layer at a time: the parameters around the layers (the embeddings'
norm, the head) read once and kept, the token table reduced to the rows the batches use, each layer read
when its turn comes and dropped after. What the streamed barrier (sweep/streamed.py) and streamed
activation matching (match/streamed.py) share."""
from __future__ import annotations

import torch

from ..models import functional as Fn
from .pieces import Blocks


def _is_layer(name: str) -> bool:
    return name.startswith("blocks.")


class LayerForward:
    """The models of `blocks` on `batches`: `outer` (per model, the parameters around the layers, the token
    table as the rows of `ids`), `embedded(n, x)`, `layer(l)` (per model, layer l's parameters).
    `transform(parts) -> parts` moves each model's parameters as they are read (an alignment's action)."""

    def __init__(self, blocks: Blocks, batches: list, transform=None):
        self.blocks, self.arch = blocks, blocks.arch
        self.transform = transform or (lambda parts: parts)
        tokens = self.arch.inputs == "tokens"
        self.ids = None
        if tokens:
            self.ids = (torch.cat([x.reshape(-1) for x, _ in batches]).unique() if batches
                        else torch.zeros(0, dtype=torch.long))
        self.embed_names = set(Fn.embedding_names(self.arch))
        n = len(blocks.cks)
        self.outer, self.tables = [{} for _ in range(n)], [None] * n
        pending = [{} for _ in range(n)]
        for parts, rows in blocks(lambda name: not _is_layer(name)):
            for i, part in enumerate(self.transform(parts)):
                for name, t in part.items():
                    if name == "tok_embed.weight" and tokens:
                        self._gather(i, t, rows.get(name, (0, t.shape[0])))
                    elif name in rows:
                        pending[i].setdefault(name, []).append(t)
                    else:
                        self.outer[i][name] = t
        for store, rowed in zip(self.outer, pending):
            store.update({name: torch.cat(ts) for name, ts in rowed.items()})

    def _gather(self, i: int, t: torch.Tensor, rows: tuple[int, int]) -> None:
        if self.tables[i] is None:
            self.tables[i] = torch.zeros(len(self.ids), t.shape[1], dtype=t.dtype)
        hit = (self.ids >= rows[0]) & (self.ids < rows[1])
        self.tables[i][hit] = t[self.ids[hit] - rows[0]]

    def embedded(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Model i's embeddings' sum for inputs x, (1, B, T, d) (before any norm of it)."""
        p = {name: self.outer[i][name].unsqueeze(0) for name in self.embed_names if name in self.outer[i]}
        if self.ids is not None:
            p["tok_embed.weight"] = self.tables[i].unsqueeze(0)
            x = torch.searchsorted(self.ids, x)  # the batch's ids as rows of the gathered table
        elif x.is_floating_point():  # images in the parameters' precision, as the in-memory engines take them
            x = x.to(next(iter(p.values())).dtype)
        return Fn.embed_sum(self.arch, p, x)

    def layer(self, l: int) -> list[dict]:
        prefix = f"blocks.{l}."
        out = [{} for _ in self.blocks.cks]
        for parts, _ in self.blocks(lambda name: name.startswith(prefix)):
            for store, part in zip(out, self.transform(parts)):
                store.update(part)
        return out


def collect_batches(data, input_spec, max_batches: int | None = None) -> list:
    """The (inputs, targets) batches a streamed pass carries together, each checked as `lf.barrier` checks them."""
    from ..sweep.checks import check_batch

    out = []
    for i, batch in enumerate(data):
        if max_batches is not None and i >= max_batches:
            break
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise ValueError("data must yield (inputs, targets) batches")
        check_batch(input_spec, *batch)
        out.append((batch[0], batch[1]))
    if not out:
        raise ValueError("no data: the iterable yielded no batches")
    return out
