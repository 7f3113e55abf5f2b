"""perf/results.py: the results convention (summaries, pages, and the check that ties them).

Each test builds a small repository in a temporary directory (a front page, one results page,
its summary) and breaks one thing, so that `check` must name it.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "perf"))
import results  # noqa: E402

REPORT = """# Allreduce side by side

- date: 2026-11-29, host: vm
- memcpy: 17.57 GB/s

## 2 ranks

| size | time us | ratio |
| ---: | ---: | ---: |
| 8 | 0.42 | 1.21x |
| 8M | 636.3 | 2.41x |

```
mpirun -n 2 fusebox-mpi-allreduce -b 8 -e 8M   # left out of the summary
```

## 2 ranks

| target | measured |
| --- | ---: |
| 2 ranks >= 1.0x | 1.11x |
"""

PAGE = """# A result

The ratio at 8 B is 1.21x; memcpy ran at 17.57 GB/s.

<!-- result-meta: data/a/run.json -->
<!-- /result-meta -->

<!-- result: data/a/run.json#2-ranks columns: size | ratio -->
<!-- /result -->
"""


def make_repo(tmp_path):
    root = tmp_path / "repo"
    (root / "docs" / "results" / "data" / "a").mkdir(parents=True)
    (root / "comm").mkdir()
    s = results.make_summary(REPORT, "bench_allreduce", "python3 perf/bench_allreduce.py",
                             "a test run", "376fcee", "2026-11-29", "vm (x86_64, 2 CPUs)")
    results.write_summary(str(root / "docs/results/data/a/run.json"), s)
    (root / "docs" / "results" / "a.md").write_text(PAGE)
    (root / "docs" / "README.md").write_text("# Docs\n\n- [a result](results/a.md)\n")
    (root / "README.md").write_text("# fusebox\n\n[docs](docs/README.md): 2.41x at 8M.\n")
    (root / "comm" / "x.h").write_text("// Note [Something] in comm/y.h\n")
    assert results.main(["--repo", str(root), "render"]) == 0
    return root


def problems(root):
    return results.check(str(root))


def test_parse_report_names_tables_and_leaves_out_code():
    tables, notes = results.parse_report(REPORT)
    assert [t["name"] for t in tables] == ["2-ranks", "2-ranks-2"]
    assert tables[0]["columns"] == ["size", "time us", "ratio"]
    assert tables[0]["rows"] == [["8", "0.42", "1.21x"], ["8M", "636.3", "2.41x"]]
    assert "- memcpy: 17.57 GB/s" in notes
    assert not any("mpirun" in n for n in notes)


def test_render_writes_the_selected_columns_and_the_run(tmp_path):
    root = make_repo(tmp_path)
    text = (root / "docs/results/a.md").read_text()
    assert "| size | ratio |\n| --- | ---: |\n| 8 | 1.21x |\n| 8M | 2.41x |\n" in text
    assert "commit `376fcee`, 2026-11-29, on vm (x86_64, 2 CPUs)" in text
    assert "- command: `python3 perf/bench_allreduce.py`" in text
    assert problems(root) == []


def test_a_table_number_edited_by_hand_fails(tmp_path):
    root = make_repo(tmp_path)
    page = root / "docs/results/a.md"
    page.write_text(page.read_text().replace("| 8 | 1.21x |", "| 8 | 1.31x |"))
    found = problems(root)
    assert len(found) == 1 and "differs from its summary" in found[0], found


def test_a_number_in_the_text_that_no_summary_holds_fails(tmp_path):
    root = make_repo(tmp_path)
    page = root / "docs/results/a.md"
    page.write_text(page.read_text().replace("is 1.21x", "is 1.25x"))
    found = problems(root)
    assert len(found) == 1 and "1.25 not in the summaries" in found[0], found
    # The front page may quote only what the pages it links to cite.
    root = make_repo(tmp_path / "second")
    (root / "README.md").write_text("# fusebox\n\n[docs](docs/README.md): 2.42x at 8M.\n")
    found = problems(root)
    assert any(p.startswith("README.md: 2.42 not in") for p in found), found


def test_a_summary_changed_after_rendering_fails(tmp_path):
    root = make_repo(tmp_path)
    path = root / "docs/results/data/a/run.json"
    s = json.loads(path.read_text())
    s["tables"][0]["rows"][0][2] = "1.19x"
    path.write_text(json.dumps(s))
    found = problems(root)
    assert any("differs from its summary" in p for p in found), found
    assert any("1.21 not in the summaries" in p for p in found), found


def test_files_no_page_links_broken_links_and_dated_folders_in_code_fail(tmp_path):
    root = make_repo(tmp_path)
    (root / "docs" / "README.md").write_text("# Docs\n\n- [a result](results/a.md), [gone](g.md)\n")
    (root / "docs" / "results" / "data" / "a" / "raw.log").write_text("x\n")
    dated = "docs/allreduce/" + "20261129-own-the-line"  # split: this file is checked too
    (root / "comm" / "x.h").write_text("// measured in %s\n" % dated)
    found = problems(root)
    assert any(p == "docs/results/data/a/raw.log: no page links to it" for p in found), found
    assert any(p.startswith("comm/x.h:1: cites a dated run folder") for p in found), found
    assert "docs/README.md: links to docs/g.md, which does not exist" in found, found


@pytest.mark.parametrize("field,value,message", [
    ("format", "fusebox-result/0", "format is"),
    ("date", "29 Nov 2026", "is not YYYY-MM-DD"),
    ("commit", "", "field 'commit'"),
    ("tables", [{"name": "t", "columns": ["a", "b"], "rows": [["1"]]}], "row 0: 1 cells"),
    ("tables", [{"name": "Bad Name", "columns": ["a"], "rows": []}], "table name 'Bad Name'"),
])
def test_malformed_summaries_are_named(tmp_path, field, value, message):
    root = make_repo(tmp_path)
    path = root / "docs/results/data/a/run.json"
    s = json.loads(path.read_text())
    s[field] = value
    path.write_text(json.dumps(s))
    with pytest.raises(results.ResultError, match=message):
        results.load_summary(str(path))
    assert any(message.split()[0] in p for p in problems(root))


def test_a_summary_over_the_size_limit_is_refused(tmp_path):
    root = make_repo(tmp_path)
    path = root / "docs/results/data/a/run.json"
    s = json.loads(path.read_text())
    s["notes"] = ["x" * 1000] * 60
    path.write_text(json.dumps(s))
    with pytest.raises(results.ResultError, match="more than the"):
        results.load_summary(str(path))
    # A driver's own summary drops notes rather than exceed it, and keeps every table.
    big = results.make_summary(REPORT + "\n".join("note %d %s" % (i, "y" * 400)
                                                  for i in range(300)),
                               "b", "c", "t", "abc1234", "2026-12-07", "m")
    assert len(json.dumps(big, indent=1)) <= results.MAX_SUMMARY_BYTES
    assert len(big["tables"]) == 2


def test_the_scaling_report_writes_its_summary(tmp_path):
    """A driver writes the format directly: scaling_report.py on the test fixture."""
    out = tmp_path / "scaling"
    shutil.copytree(os.path.join(REPO, "tests/perf/scaling_raw"), out / "raw")
    subprocess.run([sys.executable, os.path.join(REPO, "perf/cluster/scaling_report.py"),
                    "--report_only", "--out", str(out)], check=True, capture_output=True)
    s = results.load_summary(str(out / "result.json"))
    assert s["benchmark"] == "scaling_report"
    tuned = next(t for t in s["tables"] if t["name"] == "tuned-against-the-best-other-plan")
    assert ["1gbit", "2", "1100.0", "horovod", "1150.0", "0.957"] in tuned["rows"]


def test_the_repository_follows_the_convention():
    found = results.check(REPO)
    assert found == [], "\n".join(found)
