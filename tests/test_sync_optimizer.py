"""WorkerDoneSyncReplicasOptimizer: equal to the numpy oracle on uneven shards, where stock hangs."""

import json
import os
import re
import sys

import numpy as np
import pytest

from hooks.errors import ConfigError
from hooks.testing import oracle
from hooks.testing.local_cluster import LocalCluster

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tasks"))
import sync_data  # pylint: disable=g-import-not-at-top,wrong-import-position

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "sync_linear.py")]
NOISE = ("Exception in thread", "TakeGrad operation was cancelled", "Traceback")
EPOCHS = 2


def _optimizer(num_workers=3, worker_id=0, **kwargs):
  import tensorflow as tf
  from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer
  sgd = tf.compat.v1.train.GradientDescentOptimizer(sync_data.LEARNING_RATE)
  return WorkerDoneSyncReplicasOptimizer(sgd, num_workers, worker_id, **kwargs)


def _train(shards, tmp_path, *, model="linear", num_ps=1, extra=(), timeout_secs=50):
  """Runs the sync task on a LocalCluster; returns (ClusterResult, {task: report})."""
  args = [f"--shard_batches={','.join(map(str, shards))}", f"--model={model}",
          f"--output_dir={tmp_path}", f"--epochsync_num_epochs={EPOCHS}",
          "--epochsync_step_timeout_secs=30", "--epochsync_warn_after_secs=10", *extra]
  with LocalCluster(num_workers=len(shards), num_ps=num_ps, timeout_secs=timeout_secs,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(TASK + args)
    result = cluster.wait()
  reports = {}
  for name in result.tasks:
    path = tmp_path / (name.replace(":", "-") + ".json")
    if path.exists():
      reports[name] = json.loads(path.read_text())
  return result, reports


def _assert_exact(result, reports, shards, data, params0, gradients, divide=False):
  result.check()
  for name, task in result.tasks.items():
    assert not [n for n in NOISE if n in task.log], f"{name} log has shutdown noise"
  for i, n in enumerate(shards):  # Every example exactly once per epoch, on every worker.
    assert reports[f"worker:{i}"]["examples_per_epoch"] == [n * 4] * EPOCHS
  want, want_step = oracle.lockstep_sgd(params0, data, gradients, sync_data.LEARNING_RATE,
                                        EPOCHS, divide_by_initial_workers=divide)
  chief = reports["worker:0"]
  assert chief["global_step"] == want_step == EPOCHS * max(shards)
  for k, v in want.items():
    np.testing.assert_allclose(np.array(chief["params"][k]), v, rtol=0, atol=1e-5, err_msg=k)
  assert max(np.abs(v).max() for v in want.values()) > 0.1  # Training moved the parameters.


class TestLockstepSgdOracle:
  """hooks.testing.oracle against values derived by hand."""

  # Worker 0: x=1, y=2 then x=1, y=3; worker 1: x=2, y=0 (one batch); w = b = 0, lr = 0.5.
  # Step 0: residuals -2 and 0: grads (dw, db) = (-4, -4) and (0, 0), mean (-2, -2) -> w = b = 1.
  # Step 1: only worker 0: pred 2, residual -1, grad (-2, -2): mean over 1 -> w = b = 2,
  #         or divided by the 2 initial workers -> w = b = 1.5.
  SHARDS = [[(np.array([[1.0]]), np.array([2.0])), (np.array([[1.0]]), np.array([3.0]))],
            [(np.array([[2.0]]), np.array([0.0]))]]

  @pytest.mark.parametrize("divide, want", [(False, 2.0), (True, 1.5)])
  def test_two_steps_by_hand(self, divide, want):
    params, step = oracle.lockstep_sgd({"w": np.zeros(1), "b": np.zeros(())}, self.SHARDS,
                                       oracle.linear_mse_gradients, 0.5,
                                       divide_by_initial_workers=divide)
    assert step == 2
    np.testing.assert_allclose(params["w"], [want])
    np.testing.assert_allclose(params["b"], want)

  def test_epochs_repeat_and_empty_shards_count_no_step(self):
    params, step = oracle.lockstep_sgd({"w": np.zeros(1), "b": np.zeros(())},
                                       self.SHARDS + [[]], oracle.linear_mse_gradients, 0.5,
                                       num_epochs=3)
    assert step == 3 * 2
    _, no_step = oracle.lockstep_sgd({"b": np.zeros(())}, [[], []], oracle.linear_mse_gradients,
                                     0.5, num_epochs=2)
    assert no_step == 0

  def test_embedding_gradient_sums_repeated_ids(self):
    params = {"emb": np.zeros((3, 2)), "b": np.zeros(())}
    grads = oracle.embedding_mse_gradients(params, (np.array([1, 1]), np.array([1.0, 1.0])))
    # residual -1 for both rows: d emb[1] = 2 * (2/2 * -1) = -2 in each column; db = -2.
    np.testing.assert_allclose(grads["emb"], [[0, 0], [-2, -2], [0, 0]])
    np.testing.assert_allclose(grads["b"], -2.0)


class TestWorkerDoneSyncReplicasOptimizer:

  def test_exports(self):
    from hooks.sync import optimizer as sync_optimizer
    assert sorted(sync_optimizer.__all__) == [
        "ABORT_TOKEN", "DONE", "DelegatingOptimizer", "GRAD", "STOP", "SyncOps",
        "WorkerDoneSyncReplicasOptimizer"]
    assert sorted(oracle.__all__) == [
        "embedding_mse_gradients", "linear_mse_gradients", "lockstep_sgd"]

  @staticmethod
  def _graph_ops(num_workers):
    """The ops the chief's aggregation and a worker's step need (static: both branches)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    with tf.Graph().as_default():
      with v1.device("/job:ps/task:0"):  # one ps: the aggregation needs no gate (step_gate)
        global_step = v1.train.get_or_create_global_step()
        w = v1.get_variable("w", [3], initializer=v1.zeros_initializer(), use_resource=False)
      opt = _optimizer(num_workers=num_workers)
      opt.minimize(tf.reduce_sum(w * tf.constant([1.0, 2.0, 3.0])), global_step=global_step)

      def needed(target):
        seen, todo = set(), [target.op if hasattr(target, "op") else target]
        while todo:
          op = todo.pop()
          if op not in seen:
            seen.add(op)
            todo += [t.op for t in op.inputs] + list(op.control_inputs)
        return seen
      return needed(opt.sync_ops.aggregate_op), needed(opt.sync_ops.train_op)

  def test_the_aggregation_grows_by_two_ops_per_worker(self):
    """Per worker only its token queue's handle and enqueue (was 3 + a slice: 4 and more)."""
    (agg2, _), (agg8, _) = self._graph_ops(2), self._graph_ops(8)
    assert len(agg8) - len(agg2) == 2 * 6
    # Both branches, one dense variable; 36 before issue 22's Merge took the enqueues' edges,
    # 35 after; 36 since num_active is a ps variable (and its Assign) instead of a feed; 39
    # since the count of runs begun on every ps (its variable, AssignAdd and 1) finds a lost run.
    assert len(agg2) <= 39, sorted(op.name for op in agg2)
    # Nothing is fed: a scalar fed to ps:0 every step cost the chief ~0.3 ms of CPU.
    assert not [op.name for op in agg2 if op.type == "Placeholder"]
    per_worker = sorted(op.type for op in agg8)
    assert per_worker.count("FIFOQueueV2") == 1 + 8 and per_worker.count(
        "QueueEnqueueManyV2") == 8

  def test_the_worker_step_has_no_guard_op(self):
    """The step without the hook fails on the uninitialised local step (test_preflight): no
    Assert or guard flag runs in every step."""
    _, step = self._graph_ops(2)
    assert not [op.name for op in step if op.type == "Assert" or "hook_began" in op.name]
    assert len(step) <= 30, sorted(op.name for op in step)

  def test_a_sparse_gradient_is_sent_as_computed(self):
    """No deduplication or sort on the worker (issue 22: 7 ops per sparse variable): the SUM
    accumulator keeps repeated, unsorted ids exact (next test)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    with tf.Graph().as_default():
      opt, train_op = _two_worker_dense_and_sparse_model()
      (apply,) = [op for op in v1.get_default_graph().get_operations()
                  if op.type == "SparseAccumulatorApplyGradient"]
      seen, todo = set(), [train_op.op]
      while todo:
        op = todo.pop()
        if op not in seen:
          seen.add(op)
          todo += [t.op for t in op.inputs] + list(op.control_inputs)
      assert apply in seen and opt.sync_ops is not None
      assert not [op.name for op in seen if op.type in ("Unique", "TopKV2", "UnsortedSegmentSum")]

  @pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
  def test_the_sum_accumulator_keeps_repeated_unsorted_ids_exact(self, optimizer):
    """What the worker relies on (TensorFlow 2.15 and 2.21): the SparseConditionalAccumulator's
    merge assumes sorted ids but emits every row once, alone or summed with one equal id, so
    under SUM each id's total is kept; apply_gradients sums the repeated ids it returns."""
    import tensorflow as tf
    v1 = tf.compat.v1
    rng = np.random.default_rng(0)
    rows, dim, lr = 50, 3, 0.5
    grads = [(rng.integers(0, rows, 40), rng.normal(size=(40, dim)).astype(np.float32))
             for _ in range(3)]
    total = np.zeros((rows, dim))
    for ids, values in grads:
      np.add.at(total, ids, values)
    assert max(len(set(ids)) for ids, _ in grads) < 40  # repeated ids in every gradient
    with tf.Graph().as_default():
      accum = v1.SparseConditionalAccumulator(tf.float32, [rows, dim], reduction_type="SUM")
      applies = [accum.apply_indexed_slices_grad(tf.IndexedSlices(
          tf.constant(values), tf.constant(ids, tf.int64), tf.constant([rows, dim], tf.int64)), 0)
                 for ids, values in grads]
      var = v1.get_variable("v", [rows, dim], initializer=v1.ones_initializer())
      sgd = (v1.train.GradientDescentOptimizer(lr) if optimizer == "sgd" else
             v1.train.AdagradOptimizer(lr, initial_accumulator_value=1.0))
      update = sgd.apply_gradients([(accum.take_indexed_slices_grad(3), var)])
      with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())
        for op in applies:
          sess.run(op)
        sess.run(update)
        got = sess.run(var)
    want = 1 - lr * (total if optimizer == "sgd" else total / np.sqrt(1 + total ** 2))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)

  @pytest.mark.parametrize("num_workers", [0, -1, True])
  def test_rejects_num_workers_below_one(self, num_workers):
    with pytest.raises(ConfigError, match=rf"num_workers={num_workers!r} must be an integer >= 1"):
      _optimizer(num_workers=num_workers)

  @pytest.mark.parametrize("worker_id", [-1, 3])
  def test_rejects_worker_id_out_of_range(self, worker_id):
    with pytest.raises(ConfigError, match=rf"worker_id={worker_id} is out of range: it must be in "
                                          r"\[0, 3\) \(pass ClusterConfig.worker_id\)"):
      _optimizer(num_workers=3, worker_id=worker_id)

  def test_rejects_wrong_worker_names_and_optimizer(self):
    from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer
    with pytest.raises(ConfigError, match=r"worker_names has 2 names but num_workers=3"):
      _optimizer(worker_names=["chief:0", "worker:0"])
    with pytest.raises(ConfigError, match=r"opt='sgd' is not a tf.compat.v1.train.Optimizer"):
      WorkerDoneSyncReplicasOptimizer("sgd", 3, 0)

  def test_stock_constructor_arguments_take_the_worker_from_tf_config(self, monkeypatch):
    """Renaming stock's class is the whole change: worker id and names come from TF_CONFIG."""
    import tensorflow as tf
    from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p:1"]},
        "task": {"type": "worker", "index": 1}}))
    sgd = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    opt = WorkerDoneSyncReplicasOptimizer(sgd, replicas_to_aggregate=3, total_num_replicas=3)
    assert (opt.num_workers, opt.worker_id) == (3, 2)
    assert opt.worker_names == ("chief:0", "worker:0", "worker:1")
    opt = WorkerDoneSyncReplicasOptimizer(sgd, replicas_to_aggregate=3, use_locking=True,
                                          name="sync_replicas")
    assert (opt.num_workers, opt.worker_id, opt.get_name()) == (3, 2, "sync_replicas")
    opt = WorkerDoneSyncReplicasOptimizer(sgd)  # everything from TF_CONFIG
    assert (opt.num_workers, opt.worker_id) == (3, 2)
    opt = WorkerDoneSyncReplicasOptimizer(sgd, 3, 0)  # explicit arguments win, as before
    assert (opt.worker_id, opt.worker_names) == (0, ("worker:0", "worker:1", "worker:2"))

  def test_stock_arguments_that_disagree_with_tf_config(self, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["w0:1", "w1:1"], "ps": ["p:1"]}, "task": {"type": "worker",
                                                                       "index": 0}}))
    with pytest.raises(ConfigError, match=r"num_workers=3 \(or total_num_replicas\) but "
                                          r"TF_CONFIG lists 2 chief\+worker tasks"):
      _optimizer(num_workers=None, worker_id=None, replicas_to_aggregate=3)

  def test_without_a_worker_id_or_cluster_says_what_to_pass(self, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match=r"worker_id not given and no cluster found.*pass "
                                          r"worker_id=ClusterConfig.worker_id"):
      _optimizer(num_workers=None, worker_id=None, replicas_to_aggregate=3,
                 total_num_replicas=3)

  @pytest.mark.parametrize("replicas, total, match", [
      (2, 3, r"replicas_to_aggregate=2 < total_num_replicas=3 asks for backup workers: each step "
             r"would drop the gradients of the slowest 1 worker\(s\), so their examples would "
             r"not be trained in that epoch and exactly-once epochs break; set "
             r"replicas_to_aggregate=3"),
      (4, 3, r"replicas_to_aggregate=4 > total_num_replicas=3: .*exactly one gradient per step"),
      (0, None, r"replicas_to_aggregate=0 must be an integer >= 1"),
  ])
  def test_refuses_backup_workers_and_bad_stock_counts(self, replicas, total, match):
    with pytest.raises(ConfigError, match=match):
      _optimizer(num_workers=None, worker_id=0, replicas_to_aggregate=replicas,
                 total_num_replicas=total)

  def test_refuses_variable_averages_and_conflicting_num_workers(self):
    import tensorflow as tf
    with pytest.raises(ConfigError, match=r"variable_averages is not supported"):
      _optimizer(variable_averages=tf.compat.v1.train.ExponentialMovingAverage(0.9))
    with pytest.raises(ConfigError, match=r"num_workers=2 but total_num_replicas=3"):
      _optimizer(num_workers=2, worker_id=0, total_num_replicas=3)

  def test_stock_positional_arguments_get_a_hint(self):
    with pytest.raises(ConfigError, match=r"(?s)worker_id=3 is out of range.*pass them by keyword"):
      _optimizer(num_workers=3, worker_id=3)

  @pytest.mark.parametrize("num_tokens", [-1, 1, 3])
  def test_num_tokens_must_be_zero(self, num_tokens):
    with pytest.raises(ConfigError, match=rf"num_tokens={num_tokens} is not supported: it must be "
                                          r"0\..*tensorflow issue 11753.*num_tokens=0"):
      _optimizer().make_session_run_hook(True, num_tokens=num_tokens)

  def test_apply_gradients_needs_global_step_and_runs_once(self):
    import tensorflow as tf
    with tf.Graph().as_default():
      w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.zeros_initializer())
      opt, loss = _optimizer(), tf.reduce_sum(w * w)
      with pytest.raises(ConfigError, match=r"global_step=None: pass .*get_or_create_global_step"
                                            r".*or construct the optimizer with own_step_counter"):
        opt.minimize(loss)
      opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
      with pytest.raises(ConfigError, match=r"already called: build one train_op per optimizer"):
        opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())

  @pytest.mark.parametrize("head_increments", [True, False])
  def test_own_step_counter_two_optimizers_in_one_step_equal_oracle(self, head_increments):
    """w and b trained by two optimizers in one train_op, each numbering steps with its sync_step.

    head_increments: like a canned Estimator head, minimize() gets no global_step and the model
    adds 1 to global_step after both optimizers' steps (so the optimizers must not touch it);
    else the b optimizer is handed global_step and must add exactly 1 per synchronous step.
    """
    import tensorflow as tf
    from hooks import graph_keys
    v1 = tf.compat.v1
    data = sync_data.linear_shards([3])
    with tf.Graph().as_default():
      global_step = v1.train.get_or_create_global_step()
      w = v1.get_variable("w", [sync_data.DIM], initializer=v1.zeros_initializer())
      b = v1.get_variable("b", [], initializer=v1.zeros_initializer())
      x, y = v1.placeholder(tf.float32, [None, sync_data.DIM]), v1.placeholder(tf.float32, [None])
      loss = tf.reduce_mean((tf.linalg.matvec(x, w) + b - y) ** 2)
      opts = [_optimizer(num_workers=1, name=f"sync_{k}", own_step_counter=True) for k in "wb"]
      train_op = tf.group(opts[0].minimize(loss, var_list=[w]), opts[1].minimize(
          loss, var_list=[b], global_step=None if head_increments else global_step))
      if head_increments:
        with tf.control_dependencies([train_op]):
          train_op = v1.assign_add(global_step, 1).op
      assert [o.sync_ops.step.op.name for o in opts] == ["sync_w/sync_step", "sync_b/sync_step"]
      hooks = [o.make_session_run_hook(True, step_timeout_secs=20, warn_after_secs=10)
               for o in opts]
      with v1.train.MonitoredSession(hooks=hooks) as sess:
        for _ in range(EPOCHS):
          sess.run(v1.get_collection(graph_keys.EPOCH_START_OPS))
          for batch_x, batch_y in data[0]:
            # The fetch names both optimizers' train ops, so each hook bounds the step.
            sess.run([train_op] + [o.sync_ops.train_op for o in opts], {x: batch_x, y: batch_y})
          sess.run(v1.get_collection(graph_keys.DONE_OPS))
        got, got_step, sync_steps = sess.run([{"w": w, "b": b}, global_step,
                                              [o.sync_ops.step for o in opts]])
    want, want_step = oracle.lockstep_sgd({"w": np.zeros(sync_data.DIM), "b": np.zeros(())}, data,
                                          oracle.linear_mse_gradients, sync_data.LEARNING_RATE,
                                          EPOCHS)
    assert want_step == 6 and got_step == 6 and list(sync_steps) == [6, 6]
    assert [h.num_updates for h in hooks] == [6, 6]
    for k, v in want.items():
      np.testing.assert_allclose(got[k], v, rtol=0, atol=1e-5, err_msg=k)
    assert min(np.abs(v).max() for v in want.values()) > 0.1  # Both optimizers moved theirs.

  def test_registers_done_and_epoch_start_ops(self):
    import tensorflow as tf
    from hooks import graph_keys
    with tf.Graph().as_default():
      w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.zeros_initializer())
      opt = _optimizer()
      opt.minimize(tf.reduce_sum(w * w), global_step=tf.compat.v1.train.get_or_create_global_step())
      assert tf.compat.v1.get_collection(graph_keys.DONE_OPS) == [opt.sync_ops.done_op]
      assert tf.compat.v1.get_collection(graph_keys.EPOCH_START_OPS) == [
          opt.sync_ops.refresh_local_step_op]

  def test_count_epoch_op_returns_the_count_it_advanced_in_one_run(self):
    """No separate read: each run returns its own new count, even with readers running beside
    it, and resets the markers to await (num_active) in that same run."""
    import threading
    import tensorflow as tf
    with tf.Graph().as_default():
      w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.zeros_initializer())
      opt = _optimizer()
      opt.minimize(tf.reduce_sum(w * w), global_step=tf.compat.v1.train.get_or_create_global_step())
      ops = opt.sync_ops
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        reads, stop = [], threading.Event()

        def read():
          while not stop.is_set():
            reads.append(int(session.run(ops.completed_epochs)))

        reader = threading.Thread(target=read)
        reader.start()
        try:
          counts = [int(session.run(ops.count_epoch_op)) for _ in range(200)]
        finally:
          stop.set()
          reader.join(10)
      assert counts == list(range(1, 201))
      assert reads == sorted(reads) and set(reads) <= set(range(201))

  @pytest.mark.parametrize("model", ["linear", "embedding"])
  def test_one_worker_in_process_equals_oracle(self, model):
    """The whole mechanism in one process (1 worker, ps = this task): 2 epochs of 3 steps.

    Sparse gradients come from a 2-way partitioned embedding; the graph has TF2 behaviour
    (resource variables, control flow v2), unlike the cluster task's disable_v2_behavior().
    """
    import tensorflow as tf
    from hooks import graph_keys
    v1 = tf.compat.v1
    linear = model == "linear"
    data = (sync_data.linear_shards if linear else sync_data.embedding_shards)([3])
    with tf.Graph().as_default():
      step = v1.train.get_or_create_global_step()
      b = v1.get_variable("b", [], initializer=v1.zeros_initializer())
      y = v1.placeholder(tf.float32, [None])
      if linear:
        x = v1.placeholder(tf.float32, [None, sync_data.DIM])
        w = v1.get_variable("w", [sync_data.DIM], initializer=v1.zeros_initializer())
        pred, params = tf.linalg.matvec(x, w), {"w": w, "b": b}
      else:
        x = v1.placeholder(tf.int64, [None])
        emb = v1.get_variable("emb", [sync_data.VOCAB, sync_data.EMB_DIM],
                              initializer=v1.zeros_initializer(),
                              partitioner=v1.fixed_size_partitioner(2))
        pred = tf.reduce_sum(v1.nn.embedding_lookup(emb, x, partition_strategy="div"), 1)
        params = {"emb": emb.as_tensor(), "b": b}
      opt = _optimizer(num_workers=1)
      train_op = opt.minimize(tf.reduce_mean((pred + b - y) ** 2), step)
      hook = opt.make_session_run_hook(True, step_timeout_secs=20, warn_after_secs=10)
      with v1.train.MonitoredSession(hooks=[hook]) as sess:
        for _ in range(EPOCHS):  # FIFO: the DONE marker is consumed before the next GRAD one.
          sess.run(v1.get_collection(graph_keys.EPOCH_START_OPS))
          for batch_x, batch_y in data[0]:
            sess.run(train_op, {x: batch_x, y: batch_y})
          sess.run(v1.get_collection(graph_keys.DONE_OPS))
        got, got_step = sess.run([params, step])
    params0 = ({"w": np.zeros(sync_data.DIM)} if linear else
               {"emb": np.zeros((sync_data.VOCAB, sync_data.EMB_DIM))})
    want, want_step = oracle.lockstep_sgd(
        dict(params0, b=np.zeros(())), data, oracle.linear_mse_gradients if linear else
        oracle.embedding_mse_gradients, sync_data.LEARNING_RATE, EPOCHS)
    assert got_step == want_step == 6 and hook.num_updates == 6
    for k, v in want.items():
      np.testing.assert_allclose(got[k], v, rtol=0, atol=1e-5, err_msg=k)
    assert max(np.abs(v).max() for v in want.values()) > 0.1


@pytest.mark.cluster
@pytest.mark.slow
class TestWorkerDoneSyncReplicasOptimizerCluster:

  @pytest.mark.timeout(90)
  @pytest.mark.parametrize("divide", [False, True])
  def test_three_workers_7_4_1_equal_oracle(self, tmp_path, divide):
    shards = [7, 4, 1]
    extra = ["--epochsync_divide_by_initial_workers"] if divide else []
    result, reports = _train(shards, tmp_path, extra=extra)
    _assert_exact(result, reports, shards, sync_data.linear_shards(shards),
                  {"w": np.zeros(3), "b": np.zeros(())}, oracle.linear_mse_gradients, divide)

  @pytest.mark.timeout(90)
  def test_four_workers_6_6_3_0_with_an_empty_shard_equal_oracle(self, tmp_path):
    shards = [6, 6, 3, 0]
    result, reports = _train(shards, tmp_path)
    _assert_exact(result, reports, shards, sync_data.linear_shards(shards),
                  {"w": np.zeros(3), "b": np.zeros(())}, oracle.linear_mse_gradients)

  @pytest.mark.timeout(90)
  def test_embedding_partitioned_over_two_ps_equals_oracle(self, tmp_path):
    shards = [7, 4, 1]
    result, reports = _train(shards, tmp_path, model="embedding", num_ps=2)
    _assert_exact(result, reports, shards, sync_data.embedding_shards(shards),
                  {"emb": np.zeros((sync_data.VOCAB, sync_data.EMB_DIM)), "b": np.zeros(())},
                  oracle.embedding_mse_gradients)

  @pytest.mark.variant  # (stock TensorFlow's hang, the motivation; not this project's code)
  @pytest.mark.timeout(60)
  def test_stock_sync_replicas_hangs_on_7_4_1(self, tmp_path):
    """The same task with stock SyncReplicasOptimizer(3, 3), num_tokens=0, one pass."""
    result, _ = _train([7, 4, 1], tmp_path, extra=["--optimizer=stock"], timeout_secs=20)
    tasks = result.tasks
    assert tasks["worker:2"].ok and "worker:2 finished" in tasks["worker:2"].log
    assert tasks["worker:0"].timed_out and tasks["worker:1"].timed_out
    assert "finished" not in tasks["worker:0"].log + tasks["worker:1"].log

  @pytest.mark.timeout(90)
  def test_a_stale_gradient_fails_loudly_instead_of_hanging(self, tmp_path):
    """Without EPOCH_START_OPS, workers 1 and 2 (shards 4, 1) come back stale in epoch 1."""
    result, reports = _train([7, 4, 1], tmp_path, timeout_secs=50, extra=[
        "--skip_epoch_start_ops", "--epochsync_step_timeout_secs=5",
        "--epochsync_warn_after_secs=2"])
    assert not reports and not [t.name for t in result.tasks.values() if t.timed_out]
    assert all(t.returncode not in (0, None) for t in result.tasks.values())
    found = re.search(r"stale gradient\(s\), dropped by the accumulators: every worker must run "
                      r"graph_keys.EPOCH_START_OPS.*then the step:\] \[(\d \d \d)\] \[1 1 1\] "
                      r"\[(\d \d \d)\] \[7\]", result.tasks["worker:0"].log)
    assert found, result.tasks["worker:0"].log[-3000:]
    ids, steps = ([int(x) for x in group.split()] for group in found.groups())  # Arrival order.
    assert dict(zip(ids, steps)) == {0: 7, 1: 4, 2: 1}
    for name in ("worker:1", "worker:2"):
      assert ("1/3 workers sent their gradient; stale gradient from worker:1, worker:2 "
              "(local_step 4, 1 < 7") in result.tasks[name].log, name


def _two_worker_dense_and_sparse_model():
  """In the default graph: a dense and an embedding variable, worker 0 of 2's sync train_op."""
  import tensorflow as tf
  from hooks.sync import optimizer as sync_optimizer
  v1 = tf.compat.v1
  global_step = v1.train.get_or_create_global_step()
  w = v1.get_variable("w", [3], initializer=v1.zeros_initializer(), use_resource=False)
  emb = v1.get_variable("emb", [5, 2], initializer=v1.zeros_initializer(), use_resource=False)
  loss = tf.reduce_sum(w) + tf.reduce_sum(tf.nn.embedding_lookup(emb, [1, 3]))
  opt = sync_optimizer.WorkerDoneSyncReplicasOptimizer(
      v1.train.GradientDescentOptimizer(0.1), num_workers=2, worker_id=0)
  return opt, opt.minimize(loss, global_step=global_step)


class TestResetOp:
  """The RESET_OPS the chief runs at each start drain what an earlier run left on the ps."""

  def test_drains_markers_tokens_and_half_accumulated_gradients(self):
    import tensorflow as tf
    from hooks import graph_keys
    v1 = tf.compat.v1
    with tf.Graph().as_default():
      opt, train_op = _two_worker_dense_and_sparse_model()
      ops = opt.sync_ops
      (reset,) = v1.get_collection(graph_keys.RESET_OPS)
      graph = v1.get_default_graph()
      queues = [op for op in graph.get_operations() if op.type == "FIFOQueueV2"]
      accums = [op for op in graph.get_operations()
                if op.type.endswith("ConditionalAccumulator")]
      assert len(accums) == 2 and len(queues) == 3  # w (dense), emb (sparse); markers, 2 tokens
      sizes = [v1.raw_ops.QueueSizeV2(handle=q.outputs[0]) for q in queues]
      with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())
        sess.run(v1.local_variables_initializer())
        sess.run([ops.local_step_init_op, ops.chief_init_op])  # as SafeSyncTokensHook does
        # An earlier run that died mid-step: gradients applied, a marker, a stray token.
        sess.run([ops.done_op, ops.abort_step_op])
        applied = [op for op in graph.get_operations() if op.type.endswith(
            "AccumulatorApplyGradient") and "reset" not in op.name]
        sess.run(applied)
        assert sum(sess.run(sizes)) > 0
        sess.run(reset)
        assert sess.run(sizes) == [0] * len(sizes)
        counts = [v1.raw_ops.ResourceAccumulatorNumAccumulated(handle=a.outputs[0])
                  if a.outputs[0].dtype == tf.resource else
                  v1.raw_ops.AccumulatorNumAccumulated(handle=a.outputs[0]) for a in accums]
        assert sess.run(counts) == [0] * len(counts)
        assert list(sess.run(ops.diagnostics[1])) == [-2, -2]  # every worker active again
    assert train_op is not None

  def test_leaves_an_empty_accumulators_step_alone(self):
    """A fresh ps: the reset takes nothing, so chief_init_op never sets a step backwards.

    (A take advances an accumulator's step; set_global_step(0) after it makes TensorFlow log
    "Attempt to set current_global_step_ to smaller value" on the ps in every healthy run.)
    A gradient of step 0 applied after the reset is therefore kept, not dropped as stale.
    """
    import tensorflow as tf
    from hooks import graph_keys
    v1 = tf.compat.v1
    with tf.Graph().as_default():
      opt, _ = _two_worker_dense_and_sparse_model()
      (reset,) = v1.get_collection(graph_keys.RESET_OPS)
      graph = v1.get_default_graph()
      accums = [op for op in graph.get_operations()
                if op.type.endswith("ConditionalAccumulator")]
      applied = [op for op in graph.get_operations()  # the workers' (local_step not a Const)
                 if op.type.endswith("AccumulatorApplyGradient") and
                 op.inputs[1].op.type != "Const"]
      counts = [v1.raw_ops.ResourceAccumulatorNumAccumulated(handle=a.outputs[0])
                if a.outputs[0].dtype == tf.resource else
                v1.raw_ops.AccumulatorNumAccumulated(handle=a.outputs[0]) for a in accums]
      with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())
        sess.run(v1.local_variables_initializer())
        sess.run(opt.sync_ops.local_step_init_op)  # local_step = 0
        sess.run(reset)
        sess.run(applied)  # step-0 gradients, as a worker's first step sends them
        assert sess.run(counts) == [1] * len(counts)
