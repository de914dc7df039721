"""Checkpoints larger than memory: read one tensor at a time, matched layer by layer, written shard by shard.

- checkpoint.py: `StreamedCheckpoint`, a checkpoint checked in full, its standard parameters read on demand;
- pieces.py: the canonical form block by block (each block is what the canonical form couples);
- write.py: an aligned or merged checkpoint written tensor by tensor, in the input's format;
- paths.py: `apply_to_path`, `merge_paths`: the writers on paths (matching them: `lf.align(path_a, path_b)`,
  `lf.merge_many(paths)`).
"""

from .paths import apply_to_path, merge_paths

__all__ = ["apply_to_path", "merge_paths"]
