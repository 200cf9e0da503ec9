"""docs/flags.md's table is generated from hooks/config/flags.py and must be up to date."""

from absl import flags
import pytest

from hooks.config import flags as flags_lib
from hooks.config import flags_doc


def test_exports():
  assert sorted(flags_doc.__all__) == ["BEGIN", "DOC_PATH", "END", "flags_table", "render"]


def test_docs_flags_md_is_up_to_date():
  with open(flags_doc.DOC_PATH) as f:
    current = f.read()
  assert current == flags_doc.render(current), (
      "docs/flags.md is out of date: run python -m hooks.config.flags_doc")


def test_the_table_has_every_flag_with_its_variable_default_and_bounds():
  table = flags_doc.flags_table()
  rows = {line.split("|")[1].strip(" `"): [c.strip(" `") for c in line.split("|")[2:-1]]
          for line in table.splitlines()[2:]}
  assert sorted(rows) == sorted(f"--{h.name}" for h in flags_lib.EPOCHSYNC_FLAGS)
  for holder in flags_lib.EPOCHSYNC_FLAGS:
    env, default, bounds, meaning = rows[f"--{holder.name}"]
    assert env == holder.name.upper()
    assert meaning == " ".join(flags.FLAGS[holder.name].help.split())
  assert rows["--epochsync_num_epochs"][1:3] == ["1", "integer, >= 1"]
  assert rows["--epochsync_barrier_timeout_secs"][1:3] == ["1800", "seconds, finite, > 0"]
  assert rows["--epochsync_warn_after_secs"][2] == (
      "seconds, finite, > 0; < --epochsync_barrier_timeout_secs")
  assert rows["--epochsync_sync"][1] == "true"
  assert rows["--epochsync_num_workers"][1] == "unset"


def test_render_replaces_only_the_generated_part():
  doc = f"intro\n{flags_doc.BEGIN}\nstale\n{flags_doc.END}\noutro\n"
  out = flags_doc.render(doc)
  assert out.startswith("intro\n") and out.endswith("\noutro\n") and "stale" not in out
  assert flags_doc.flags_table() in out


@pytest.mark.estimator
def test_the_documented_estimator_form_reads_the_variables_without_absl_parsing(monkeypatch):
  """docs/flags.md's code block (EpochSyncRunConfig with settings_from_flags()) applies the
  EPOCHSYNC_* variables in a program that never parses absl flags."""
  monkeypatch.setenv("EPOCHSYNC_NUM_EPOCHS", "2")
  monkeypatch.setenv("EPOCHSYNC_SYNC", "false")
  monkeypatch.delenv("TF_CONFIG", raising=False)
  assert not flags.FLAGS.is_parsed()
  with open(flags_doc.DOC_PATH) as f:
    block = f.read().split("```python\n", 1)[1].split("```", 1)[0]
  assert "settings=epochsync_flags.settings_from_flags()" in block, block
  namespace = {"estimator_ext": pytest.importorskip("estimator_ext"),
               "model_dir": "/tmp/epochsync-flags-doc"}
  exec(block, namespace)  # pylint: disable=exec-used; the documented lines, as written
  settings = namespace["config"].settings
  assert (settings.num_epochs, settings.sync) == (2, False)
