"""In-process TensorFlow helpers shared by the hooks' unit tests.

Importing `graph` into a test module gives each of its tests a fresh default graph; the
loops are the user's `while not sess.should_stop(): sess.run(train_op)`, bounded so that a
broken stop fails the test instead of hanging it.
"""

from typing import Optional

import pytest
import tensorflow as tf

v1 = tf.compat.v1
v1.disable_v2_behavior()

# The device of an in-process session: stands in for "/job:ps/task:0" in unit tests.
LOCAL = "/job:localhost/replica:0/task:0"


@pytest.fixture(autouse=True)
def graph():
  with tf.Graph().as_default() as g:
    yield g


def user_loop(sess, train_op, max_steps: int = 1000) -> int:
  """Runs the user's loop on an open MonitoredSession; returns the number of steps."""
  steps = 0
  while not sess.should_stop():
    assert steps < max_steps, "the session never stopped"
    sess.run(train_op)
    steps += 1
  return steps


def train(hooks, train_op, checkpoint_dir: Optional[str] = None, max_steps: int = 1000) -> int:
  """A chief's MonitoredSession (restoring `checkpoint_dir`) running the user loop."""
  creator = v1.train.ChiefSessionCreator(checkpoint_dir=checkpoint_dir)
  with v1.train.MonitoredSession(creator, hooks=hooks) as sess:
    return user_loop(sess, train_op, max_steps)
