"""Where an engine's arrays live: one mesh, the parameters placed on it, and the dtype activations take there.

Every job of the engine puts its host arrays on the devices through one `Placement`: token rows split over the
mesh's data axis (or replicated), masks split or replicated likewise, everything else replicated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.typing import ArrayLike

from jaxloc.engine import mesh as mesh_lib
from jaxloc.engine.masks import Fills, Masks
from jaxloc.engine.scoring_kernels import Rows
from jaxloc.models.decoder import Ablation

# The token-row arrays of a scoring call; its targets stay replicated.
_ROW_FIELDS = ("tokens", "positions", "segments")


@dataclasses.dataclass(frozen=True)
class Placement:
  """mesh: the devices (`mesh.make_mesh`); params: the model's parameters placed on it (`mesh.shard_params`);
  dtype: the activation dtype (parameters stay in their own dtype in memory and are cast per layer)."""

  mesh: Mesh
  params: Any
  dtype: Any

  @classmethod
  def build(cls, params: Any, mesh: Mesh, dtype: Any) -> "Placement":
    return cls(mesh, mesh_lib.shard_params(params, mesh), dtype)

  @property
  def data_parallel(self) -> int:
    return self.mesh.shape[mesh_lib.DATA]

  @property
  def replicated(self) -> NamedSharding:
    return mesh_lib.replicated(self.mesh)

  def split(self, ndim: int) -> NamedSharding:
    """The leading dimension of an `ndim`-array over the data axis."""
    return mesh_lib.data_sharding(self.mesh, ndim)

  def put(self, array: ArrayLike, sharding: NamedSharding | None = None) -> jax.Array:
    return mesh_lib.put(array, self.replicated if sharding is None else sharding)

  def prefix(self, tokens: np.ndarray) -> jax.Array | None:
    """A request set's shared prefix tokens [P], replicated (None when there is none)."""
    return self.put(tokens) if len(tokens) else None

  def rows(self, rows: Rows, sharding: NamedSharding) -> Rows:
    """A scoring chunk's arrays: token rows with `sharding`, targets replicated."""
    return Rows(*(self.put(getattr(rows, f.name), sharding if f.name in _ROW_FIELDS else self.replicated)
                  for f in dataclasses.fields(rows)))

  def fills(self, fills: Fills) -> Fills:
    """Checked mean-ablation values (`masks.check_fills`) in the activation dtype, replicated."""
    return Fills(*(None if f is None else self.put(f.astype(self.dtype)) for f in (fills.heads, fills.neurons)))

  def ablation(self, masks: Masks, fills: Fills, sharding: NamedSharding) -> Ablation:
    """The model's `Ablation` for a batch of masks, placed with `sharding`, with the fills of the kinds it holds."""
    put = lambda m: None if m is None else self.put(m.astype(self.dtype), sharding)  # noqa: E731
    # Placed fills (`fills`) are jax.Arrays; `Fills` also types the host's.
    head_fill, neuron_fill = (cast("jax.Array | None", f) for f in (fills.heads, fills.neurons))
    return Ablation(put(masks.heads), head_fill if masks.heads is not None else None,
                    put(masks.neurons), neuron_fill if masks.neurons is not None else None)
