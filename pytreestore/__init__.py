"""pytreestore: a persistent, columnar store for JAX pytrees.

Records (pytrees of the same structure) are appended one at a time, as a list, or as a
batched pytree; each leaf is kept as one chunked zarr v3 array keyed by its tree path; loads
come back as the same classes with a leading record axis, ready for ``jax.vmap``.

Example:
    >>> import jax, pytreestore
    >>> store = pytreestore.create("memory://doc-init", {"x": 0.0, "y": 0.0})
    >>> store.extend({"x": float(i), "y": 2.0 * i} for i in range(3))
    >>> jax.vmap(lambda r: r["x"] + r["y"])(store[:])
    Array([0., 3., 6.], dtype=float32)
"""

from pytreestore import errors as errors
from pytreestore._format.schema import FORMAT_VERSION as FORMAT_VERSION
from pytreestore._format.schema import ColumnSpec as ColumnSpec
from pytreestore._format.schema import TreeSchema as TreeSchema
from pytreestore._format.statics import register_static_codec as register_static_codec
from pytreestore._fragments.fragment import Fragment as Fragment
from pytreestore._inspect.verify import VerifyReport as VerifyReport
from pytreestore._log.prune import VacuumReport as VacuumReport
from pytreestore._log.versions import Version as Version
from pytreestore._open.copy import copy as copy
from pytreestore._open.evolve_path import evolve as evolve
from pytreestore._open.open import create as create
from pytreestore._open.open import open as open
from pytreestore._open.sharing import write_fragment as write_fragment
from pytreestore._pipelines.batches import BatchIterator as BatchIterator
from pytreestore._pipelines.batches import GrainSource as GrainSource
from pytreestore._pipelines.order import BatchState as BatchState
from pytreestore._pipelines.replay import ReplayBuffer as ReplayBuffer
from pytreestore._read.tables import Segments as Segments
from pytreestore._store import TreeStore as TreeStore
from pytreestore._tree.stack import stack as stack
from pytreestore._tree.stack import unstack as unstack
from pytreestore._write.recorder import Recorder as Recorder
from pytreestore._write.scan import record_scan as record_scan

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "BatchIterator",
    "BatchState",
    "ColumnSpec",
    "Fragment",
    "GrainSource",
    "Recorder",
    "ReplayBuffer",
    "Segments",
    "TreeSchema",
    "TreeStore",
    "VacuumReport",
    "VerifyReport",
    "Version",
    "__version__",
    "copy",
    "create",
    "errors",
    "evolve",
    "open",
    "record_scan",
    "register_static_codec",
    "stack",
    "unstack",
    "write_fragment",
]
