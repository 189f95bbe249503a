"""Loading task records: our JSONL, SWE-bench-style files (JSON-encoded test lists), bad input."""
import json
import sys

import pytest

from dockyard.data import swe

RECORD = dict(
    instance_id="astropy__astropy-12907", repo="astropy/astropy",
    base_commit="d16bfe05a744909de4b27f5875fe0d4ed41ce607", patch="diff --git a/x b/x\n",
    test_patch="diff --git a/t b/t\n", problem_statement="Modeling's separability_matrix ...",
    hints_text="", created_at="2022-03-03T15:14:54Z", version="4.3",
    FAIL_TO_PASS='["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]',
    PASS_TO_PASS='["astropy/modeling/tests/test_separable.py::test_coord_matrix"]',
    environment_setup_commit="298ccb478e6bf092953bca67a3d29dc6c35f6752",
)


def test_swe_bench_jsonl_with_json_encoded_lists(tmp_path):
  path = tmp_path / "swe_bench.jsonl"
  other = dict(RECORD, instance_id="x__y-1", repo="x/y", FAIL_TO_PASS=["a.py::t"], PASS_TO_PASS=[],
               version=3.0)
  path.write_text(json.dumps(RECORD) + "\n\n" + json.dumps(other) + "\n")
  tasks = swe.load_tasks(str(path))
  assert [t.instance_id for t in tasks] == ["astropy__astropy-12907", "x__y-1"]
  assert tasks[0].FAIL_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]
  assert tasks[0].PASS_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_coord_matrix"]
  assert tasks[1].version == "3.0" and tasks[1].PASS_TO_PASS == []
  wire = tasks[0].sandbox_dict("")
  assert wire["patch"] == "" and set(wire) == set(swe.SANDBOX_KEYS)
  assert tasks[0].sandbox_dict()["patch"] == RECORD["patch"]


def test_json_list_and_unknown_keys_survive_round_trip(tmp_path):
  rec = dict(RECORD, image_name="sweb.eval.x86_64.astropy", FAIL_TO_PASS=["a::b"])
  path = tmp_path / "gym.json"
  path.write_text(json.dumps([rec]))
  (task,) = swe.load_tasks(str(path))
  assert task.extra == {"image_name": "sweb.eval.x86_64.astropy"}
  out = tmp_path / "out.jsonl"
  swe.write_jsonl(str(out), [task])
  (again,) = swe.load_tasks(str(out))
  assert again == task


@pytest.mark.parametrize("change,match", [
    (dict(FAIL_TO_PASS=None), r"missing required key\(s\) \['FAIL_TO_PASS'\]"),
    (dict(repo="astropy"), r"repo must be 'owner/name'"),
    (dict(FAIL_TO_PASS="[not json"), r"FAIL_TO_PASS: a string that is not a JSON list"),
    (dict(PASS_TO_PASS=[1, 2]), r"PASS_TO_PASS: expected a list of test ids"),
    (dict(patch=5), r"patch must be a string"),
])
def test_bad_records_name_the_problem(tmp_path, change, match):
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps({k: v for k, v in dict(RECORD, **change).items() if v is not None}) + "\n")
  with pytest.raises(ValueError, match=match) as e:
    swe.load_tasks(str(path))
  assert "bad.jsonl:1" in str(e.value)


def test_bad_files(tmp_path):
  dup = tmp_path / "dup.jsonl"
  dup.write_text((json.dumps(RECORD) + "\n") * 2)
  with pytest.raises(ValueError, match="duplicate instance_id"):
    swe.load_tasks(str(dup))
  broken = tmp_path / "broken.jsonl"
  broken.write_text("{nope\n")
  with pytest.raises(ValueError, match=r"broken.jsonl:1: not valid JSON"):
    swe.load_tasks(str(broken))
  with pytest.raises(ValueError, match="unknown task file type"):
    swe.load_tasks(_touch(tmp_path / "t.csv"))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    swe.load_tasks(str(tmp_path / "missing.jsonl"))


def _touch(p):
  p.write_text("")
  return str(p)


def test_parquet(tmp_path):
  # pyarrow comes with the [bench] extra (datasets, trl), which CI installs: no fallback here, a
  # broken pyarrow fails this test instead of passing through the "not installed" branch below.
  import pyarrow as pa
  import pyarrow.parquet as pq
  path = tmp_path / "swe.parquet"
  pq.write_table(pa.Table.from_pylist([RECORD]), str(path))
  (task,) = swe.load_tasks(str(path))
  assert task.FAIL_TO_PASS[0].endswith("result6]")


def test_parquet_without_pyarrow_names_the_missing_package(tmp_path, monkeypatch):
  path = tmp_path / "swe.parquet"
  path.write_bytes(b"PAR1")
  monkeypatch.setitem(sys.modules, "pyarrow", None)           # `import pyarrow...` raises ImportError
  monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
  with pytest.raises(ImportError, match="needs pyarrow"):
    swe.load_tasks(str(path))
