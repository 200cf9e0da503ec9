"""docs/flags.md's table is generated from hooks/config/flags.py and must be up to date."""

from absl import flags

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
