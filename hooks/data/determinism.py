"""Finds the stages of a tf.data pipeline whose order can differ on a rerun of the same program.

A resume from a mid-epoch checkpoint skips the batches the checkpoint holds by their position in
the worker's shard, which is exact only if a rerun reads the shard in the same order. This module
reads the dataset's ops (its variant tensor's op, the ops it reads from, and the tf.data functions
they call, e.g. an interleave's) and names each stage that can reorder: an unseeded shuffle
(neither `seed=` nor `tf.compat.v1.set_random_seed`; `Dataset.list_files` shuffles unseeded by
default), an unseeded `Dataset.random`/`sample_from_datasets`/sampling, a parallel map,
interleave or batch with `deterministic=False` (or `sloppy=True`, or left at its default while
`tf.data.Options.deterministic` is False), and a read from the tf.data service. A seeded shuffle
is deterministic: `EpochInput` re-initialises its iterator every epoch, so it repeats its order
each epoch, whatever `reshuffle_each_iteration`, and a rerun gives the same order again.

Typical usage:
  stages = determinism.nondeterministic_stages(dataset)  # e.g. ["shuffle 'ShuffleDataset': ..."]
  determinism.warn_if_nondeterministic(dataset, "worker:1")  # one WARNING if any
"""

from typing import Any, Callable, Iterable, List, Optional, Tuple

import tensorflow as tf
from tensorflow.core.framework import dataset_options_pb2

from hooks import log as logging

__all__ = ["nondeterministic_stages", "warn_if_nondeterministic"]

# Ops that draw a random order or sample: (stage, input index of seed, of seed2); "random" is
# Dataset.random's and sample_from_datasets' (which draws its choices from one).
# Their Python front ends feed two constant zeros when neither the op nor the graph has a seed
# (tensorflow/python/data/util/random_seed.py); a seeded one feeds a non-zero or computed seed.
_SEEDED_OPS = {
    "ShuffleDataset": ("shuffle", 2, 3),
    "ShuffleDatasetV3": ("shuffle", 2, 3),
    "ShuffleAndRepeatDataset": ("shuffle_and_repeat", 2, 3),
    "ShuffleAndRepeatDatasetV2": ("shuffle_and_repeat", 2, 3),
    "RandomDataset": ("random", 0, 1),
    "RandomDatasetV2": ("random", 0, 1),
    "ExperimentalRandomDataset": ("random", 0, 1),
    "SamplingDataset": ("sampling", 2, 3),
}
# Ops that run calls in parallel and may deliver them in completion order.
_PARALLEL_OPS = {
    "ParallelMapDataset": "map", "ParallelMapDatasetV2": "map",
    "ParallelInterleaveDatasetV2": "interleave", "ParallelInterleaveDatasetV3": "interleave",
    "ParallelInterleaveDatasetV4": "interleave",
    "LegacyParallelInterleaveDatasetV2": "parallel_interleave",
    "ParallelBatchDataset": "batch",
}
_SHUFFLE_FIX = "neither seed= nor tf.compat.v1.set_random_seed set, so every run draws another order"

_NodeLookup = Callable[[str], Optional[tf.compat.v1.NodeDef]]


def nondeterministic_stages(dataset: tf.data.Dataset) -> List[str]:
  """The stages of `dataset` whose order can differ on a rerun, each named with the reason.

  E.g. ["shuffle 'ShuffleDataset': unseeded (neither seed= nor ...)", "map
  'ParallelMapDatasetV2': deterministic=False ..."]; [] for a deterministic pipeline (a seeded
  shuffle, a parallel map left deterministic, a TFRecordDataset of a file list, batch, prefetch).

  Args:
    dataset: `tf.data.Dataset`, built in graph mode (as EpochInput's) or eagerly.
  """
  variant = tf.data.experimental.to_variant(dataset)
  if hasattr(variant, "op") and not tf.executing_eagerly():
    graph = variant.graph
    lookup = lambda name: _graph_node(graph, name)
    library = _lazy(lambda: graph.as_graph_def().library)
    root = variant.op.name
    functions = lambda name: _graph_function(graph, name, library)
  else:  # Eager: the dataset's own graph, as tf.data serializes it.
    graph_def = tf.compat.v1.GraphDef.FromString(tf.raw_ops.DatasetToGraphV2(
        input_dataset=variant, external_state_policy=1, strip_device_assignment=True).numpy())
    nodes = {n.name: n for n in graph_def.node}
    lookup = nodes.get
    by_name = {f.signature.name: f for f in graph_def.library.function}
    functions = by_name.get
    root = _eager_root(graph_def)
  walk = _Walk(lookup, functions)
  walk.graph_nodes(root)
  return walk.stages


def warn_if_nondeterministic(dataset: tf.data.Dataset, task_name: str) -> List[str]:
  """Logs one WARNING naming the stages of `dataset` that can reorder on a rerun; returns them.

  Meant for pipelines that resume from mid-epoch checkpoints (call it once per task where they
  are on): such a resume skips batches by position, so an order that differs on the rerun would
  train some examples twice and others not at all in that epoch. Never raises: a pipeline it
  cannot read gets an INFO line.

  Args:
    dataset: `tf.data.Dataset`, this worker's shard for one epoch.
    task_name: `str`, e.g. "worker:1", for the log line.
  """
  try:
    stages = nondeterministic_stages(dataset)
  except Exception as e:  # pylint: disable=broad-except; advice only: never stop the training
    logging.info("%s: could not inspect the input pipeline's order (%s: %s); a resume from a "
                 "mid-epoch checkpoint needs the same order on a rerun", task_name,
                 type(e).__name__, e)
    return []
  if stages:
    logging.warning(
        "%s: the input pipeline can read its shard in another order on a rerun: %s. A resume "
        "from a mid-epoch checkpoint skips the batches the checkpoint holds by their position, "
        "which needs the same order on the rerun (else some examples of that epoch are trained "
        "twice and others not at all): seed the shuffle (shuffle(..., seed=N), or "
        "tf.compat.v1.set_random_seed(N) before building the dataset, or an Estimator's "
        "RunConfig(tf_random_seed=N); list_files(..., shuffle=False) or seed=N) and leave "
        "deterministic at True (tf.data.Options.deterministic, map/interleave/batch "
        "deterministic=)", task_name, "; ".join(stages))
  return stages


def _lazy(make):
  cache = []
  return lambda: cache[0] if cache else (cache.append(make()) or cache[0])


def _graph_function(graph: tf.Graph, name: str, library):
  """The FunctionDef `name` of `graph`: from the graph's function (TensorFlow 2.15-2.21 keep it
  there), else from its GraphDef's library, which copies the whole graph (its constants too)."""
  function = getattr(graph, "_get_function", lambda _: None)(name)
  definition = getattr(function, "cached_definition", None) or getattr(function, "definition",
                                                                       None)
  if definition is not None:
    return definition
  return next((f for f in library().function if f.signature.name == name), None)


def _graph_node(graph: tf.Graph, name: str) -> Optional[tf.compat.v1.NodeDef]:
  try:
    return graph.get_operation_by_name(name).node_def
  except KeyError:
    return None


def _eager_root(graph_def) -> Optional[str]:
  """The dataset's node in a DatasetToGraph GraphDef: the input of its `_Retval`/last node."""
  for node in graph_def.node:
    if node.op == "_Retval":
      return _input_name(node.input[0])
  return graph_def.node[-1].name if graph_def.node else None


def _input_name(spec: str) -> str:
  """"name", "name:1" or "name:output:0" (in a function) -> "name"."""
  return spec.split(":", 1)[0]


class _Walk:
  """One traversal: the top-level ops from the root, then every node of each function called."""

  def __init__(self, lookup: _NodeLookup, functions: Callable[[str], Any]):
    self._lookup, self._functions = lookup, functions
    self._seen_functions = set()
    self._pending: List[Tuple[tf.compat.v1.NodeDef, str, _NodeLookup]] = []  # left to judge
    self._deterministic_option: Optional[bool] = None  # tf.data.Options.deterministic, if set
    self.stages: List[str] = []

  def graph_nodes(self, root: Optional[str]) -> None:
    seen, queue = set(), [root] if root else []
    while queue:  # Breadth first: the outermost OptionsDataset's setting is met first.
      node = self._lookup(queue.pop(0))
      if node is None or node.name in seen:
        continue
      seen.add(node.name)
      self._judge_later(node, "", self._lookup)
      queue.extend(_input_name(i) for i in node.input if not i.startswith("^"))
    for node, where, lookup in self._pending:
      self._judge(node, where, lookup)

  def _judge_later(self, node, where: str, lookup: _NodeLookup) -> None:
    if node.op == "OptionsDataset" and self._deterministic_option is None:
      options = dataset_options_pb2.Options.FromString(node.attr["serialized_options"].s)
      if options.HasField("deterministic"):
        self._deterministic_option = options.deterministic
    self._pending.append((node, where, lookup))
    for fn in _called_functions(node):
      self._function_nodes(fn, node.name)

  def _function_nodes(self, name: str, caller: str) -> None:
    if name in self._seen_functions:
      return
    self._seen_functions.add(name)
    fdef = self._functions(name)
    if fdef is None:
      return
    nodes = {n.name: n for n in fdef.node_def}
    where = f" (in the function of {caller!r})"
    for node in fdef.node_def:
      self._judge_later(node, where, nodes.get)

  def _judge(self, node, where: str, lookup: _NodeLookup) -> None:
    label = f"{{}} {node.name!r}{where}"
    if node.op in _SEEDED_OPS:
      stage, seed, seed2 = _SEEDED_OPS[node.op]
      if _const_input(node, seed, lookup) == 0 and _const_input(node, seed2, lookup) == 0:
        self.stages.append(label.format(stage) + f": unseeded ({_SHUFFLE_FIX})")
    elif node.op in _PARALLEL_OPS:
      stage = _PARALLEL_OPS[node.op]
      deterministic = node.attr["deterministic"].s if "deterministic" in node.attr else b""
      if "sloppy" in node.attr and node.attr["sloppy"].b:
        self.stages.append(label.format(stage) + ": sloppy=True delivers parallel calls in "
                           "the order they finish")
      elif deterministic == b"false":
        self.stages.append(label.format(stage) + ": deterministic=False delivers parallel "
                           "calls in the order they finish")
      elif deterministic == b"default" and self._deterministic_option is False:
        self.stages.append(label.format(stage) + ": tf.data.Options.deterministic=False "
                           "(experimental_deterministic) lets its parallel calls deliver in "
                           "the order they finish")
    elif node.op.startswith("DataServiceDataset"):
      self.stages.append(label.format("distribute (tf.data service)") + ": the service hands "
                         "out elements in the order its workers produce them")


def _called_functions(node) -> Iterable[str]:
  for value in node.attr.values():
    if value.HasField("func"):
      yield value.func.name
    elif value.HasField("list"):
      yield from (f.name for f in value.list.func)


def _const_input(node, index: int, lookup: _NodeLookup):
  """The value of `node`'s input `index` if a Const op feeds it (directly), else None."""
  inputs = [i for i in node.input if not i.startswith("^")]
  if index >= len(inputs):
    return None
  source = lookup(_input_name(inputs[index]))
  if source is None or source.op != "Const":
    return None
  value = tf.make_ndarray(source.attr["value"].tensor)
  return value.item() if value.size == 1 else None
