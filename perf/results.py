#!/usr/bin/env python3
"""fusebox's results convention: compact run summaries, and the pages built from them.

A result is a page under docs/results/ (what was measured, the table, the commit, the command,
the date, the machine), backed by one compact summary file per run under docs/results/data/.
Raw logs stay out of git.

The summary format, `fusebox-result/1`, is one JSON object of at most MAX_SUMMARY_BYTES:

    {"format": "fusebox-result/1",
     "benchmark": "bench_allreduce",          # the driver that wrote it
     "title": "...", "commit": "376fcee", "date": "2026-11-29",
     "command": "python3 perf/bench_allreduce.py ...", "machine": "vm (x86_64, 2 CPUs)",
     "tables": [{"name": "2-ranks", "heading": "2 ranks",
                 "columns": ["size", ...], "rows": [["8", "0.42", ...], ...]}],
     "notes": ["the report's lines outside its tables", ...]}

Tables hold the cells as the driver printed them. The drivers write it directly
(`write_run_summary`, from the report text they print); `summarize` does it for a report
written by other means.

A page names what it shows with markers that `render` fills and `check` verifies:

    <!-- result: data/allreduce-local/local-final.json#2-ranks columns: size | ucxz time us -->
    (the table, generated)
    <!-- /result -->
    <!-- result-meta: data/allreduce-local/local-final.json -->
    (commit, date, machine and command, generated)
    <!-- /result-meta -->

`check` fails where a generated block differs from its summary, where a decimal number in a
results page's text (or in an index page, README.md, which may quote the pages it links) is not
one its summaries hold, where a summary is malformed or too large, where a page links to a file
that does not exist, where a file under docs/ is linked from no page, where docs/ outgrows its
budget, or where code cites a dated run folder.

Usage:
    python3 perf/results.py render [PAGE...]      regenerate the blocks (default: every page)
    python3 perf/results.py check                 exit 1 and name each problem
    python3 perf/results.py summarize --report REPORT --benchmark NAME --command CMD --out FILE
"""

import argparse
import datetime
import json
import os
import platform
import re
import socket
import subprocess
import sys

FORMAT = "fusebox-result/1"
MAX_SUMMARY_BYTES = 50 * 1024
MAX_TABLES = 64
MAX_COLUMNS = 48
MAX_ROWS = 2000
MAX_CELL_CHARS = 400
MAX_NOTES = 400
MAX_DOCS_FILES = 300
MAX_DOCS_BYTES = 10 * 1000 * 1000

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Folders whose sources must cite Notes and result pages, never dated run folders.
CODE_DIRS = ("comm", "bucketing", "autotune", "perf", "plugins", "tools", "tests", "scripts",
             "cmake")
DATED_FOLDER = re.compile(r"docs/[A-Za-z0-9_.-]+/20\d{6}")
# Recorded data whose provenance is a path in git history (at a named
# commit), and the script that extracted it: they name old run folders as a
# source, not as a citation.
PROVENANCE_DIRS = ("tests/autotune/data",)

MARKER = re.compile(r"<!-- result: (?P<path>[^#\s]+)#(?P<table>\S+)"
                    r"(?: columns: (?P<columns>.*?))? -->\n(?P<body>.*?)<!-- /result -->\n",
                    re.S)
META_MARKER = re.compile(r"<!-- result-meta: (?P<path>\S+) -->\n(?P<body>.*?)"
                         r"<!-- /result-meta -->\n", re.S)
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![.\d])")


class ResultError(Exception):
    """A summary or page that does not follow the convention; the message names what and where."""


# --- Reports to summaries ---------------------------------------------------------------------

def _split_row(line):
    cells = line.strip()
    if cells.startswith("|"):
        cells = cells[1:]
    if cells.endswith("|"):
        cells = cells[:-1]
    return [c.strip() for c in cells.split("|")]


def _is_rule(cells):
    return all(re.fullmatch(r":?-{3,}:?", c) for c in cells)


def _slug(text, limit=40):
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if len(s) > limit:
        s = s[:limit].rsplit("-", 1)[0]
    return s or "table"


def parse_report(text):
    """Splits a report's text into its pipe tables and its other lines.

    Returns (tables, notes). A table is named after the nearest heading above it ('## 2 ranks'
    gives '2-ranks'); the second table under one heading gets '-2', and so on. Fenced code
    blocks are left out of both (they hold command lines, which the summary's `command` names).
    """
    tables, notes = [], []
    heading, used = "", {}
    lines = text.splitlines()
    i, in_code = 0, False
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            in_code = not in_code
            i += 1
            continue
        if in_code:
            i += 1
            continue
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            heading = m.group(1).strip()
        if (line.lstrip().startswith("|") and i + 1 < len(lines)
                and lines[i + 1].lstrip().startswith("|") and _is_rule(_split_row(lines[i + 1]))):
            columns = _split_row(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                row = _split_row(lines[i])
                row += [""] * (len(columns) - len(row))
                rows.append(row[:len(columns)])
                i += 1
            base = _slug(heading)
            used[base] = used.get(base, 0) + 1
            name = base if used[base] == 1 else "%s-%d" % (base, used[base])
            tables.append({"name": name, "heading": heading, "columns": columns, "rows": rows})
            continue
        if line.strip():
            notes.append(line.rstrip())
        i += 1
    return tables, notes


def make_summary(report_text, benchmark, command, title, commit, date, machine):
    """A validated summary of one run from the report its driver printed."""
    tables, notes = parse_report(report_text)
    summary = {"format": FORMAT, "benchmark": benchmark, "title": title, "commit": commit,
               "date": date, "command": command, "machine": machine, "tables": tables,
               "notes": notes[:MAX_NOTES]}
    # Notes go first where the whole is too large: the tables are the result.
    while len(json.dumps(summary, indent=1)) > MAX_SUMMARY_BYTES and summary["notes"]:
        summary["notes"] = summary["notes"][:len(summary["notes"]) // 2]
    validate_summary(summary, "<new summary of %s>" % benchmark)
    return summary


def git_commit(repo=REPO):
    try:
        out = subprocess.run(["git", "-C", repo, "rev-parse", "--short=7", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "-uno"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return out.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def this_machine():
    return "%s (%s, %d CPUs)" % (socket.gethostname(), platform.machine(), os.cpu_count() or 0)


def write_run_summary(out_dir, report_text, benchmark, command, title):
    """Writes out_dir/result.json for the run whose report is report_text; returns its path.

    Called by every benchmark driver at the end of a run. The file is what a results page cites:
    copy it to docs/results/data/<page>/ and run `python3 perf/results.py render`.
    """
    summary = make_summary(report_text, benchmark, command, title, git_commit(),
                           datetime.date.today().isoformat(), this_machine())
    path = os.path.join(out_dir, "result.json")
    write_summary(path, summary)
    return path


def write_summary(path, summary):
    validate_summary(summary, path)
    text = json.dumps(summary, indent=1) + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# --- Reading and validating summaries --------------------------------------------------------

def _check(cond, where, what):
    if not cond:
        raise ResultError("%s: %s" % (where, what))


def validate_summary(s, where):
    """Raises ResultError naming the first field that breaks the format."""
    _check(isinstance(s, dict), where, "not a JSON object")
    _check(s.get("format") == FORMAT, where, "format is %r, expected %r" % (s.get("format"),
                                                                           FORMAT))
    for key in ("benchmark", "title", "commit", "date", "command", "machine"):
        v = s.get(key)
        _check(isinstance(v, str) and 0 < len(v) <= 4000, where,
               "field %r must be a non-empty string of at most 4000 characters" % key)
    _check(re.fullmatch(r"\d{4}-\d{2}-\d{2}", s["date"]) is not None, where,
           "date %r is not YYYY-MM-DD" % s["date"])
    tables = s.get("tables")
    _check(isinstance(tables, list) and len(tables) <= MAX_TABLES, where,
           "tables must be a list of at most %d" % MAX_TABLES)
    names = set()
    for t in tables:
        _check(isinstance(t, dict), where, "a table is not an object")
        name = t.get("name")
        _check(isinstance(name, str) and re.fullmatch(r"[a-z0-9-]+", name or "") is not None,
               where, "table name %r is not [a-z0-9-]+" % (name,))
        _check(name not in names, where, "table %r appears twice" % name)
        names.add(name)
        cols = t.get("columns")
        _check(isinstance(cols, list) and 0 < len(cols) <= MAX_COLUMNS
               and all(isinstance(c, str) for c in cols), where,
               "table %r: columns must be 1-%d strings" % (name, MAX_COLUMNS))
        rows = t.get("rows")
        _check(isinstance(rows, list) and len(rows) <= MAX_ROWS, where,
               "table %r: rows must be a list of at most %d" % (name, MAX_ROWS))
        for k, r in enumerate(rows):
            _check(isinstance(r, list) and len(r) == len(cols), where,
                   "table %r row %d: %s cells for %d columns"
                   % (name, k, len(r) if isinstance(r, list) else "no", len(cols)))
            _check(all(isinstance(c, str) and len(c) <= MAX_CELL_CHARS for c in r), where,
                   "table %r row %d: cells must be strings of at most %d characters"
                   % (name, k, MAX_CELL_CHARS))
    notes = s.get("notes", [])
    _check(isinstance(notes, list) and len(notes) <= MAX_NOTES
           and all(isinstance(n, str) for n in notes), where,
           "notes must be at most %d strings" % MAX_NOTES)


def load_summary(path):
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise ResultError("%s: cannot read (%s)" % (path, e.strerror))
    _check(size <= MAX_SUMMARY_BYTES, path,
           "%d bytes, more than the %d a summary may hold" % (size, MAX_SUMMARY_BYTES))
    try:
        with open(path) as f:
            s = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ResultError("%s: not JSON (%s)" % (path, e))
    validate_summary(s, path)
    return s


# --- Rendering pages ---------------------------------------------------------------------------

def _table_of(summary, name, where):
    for t in summary["tables"]:
        if t["name"] == name:
            return t
    raise ResultError("%s: no table %r (it has: %s)"
                      % (where, name, ", ".join(t["name"] for t in summary["tables"])))


def render_table(summary, name, columns, where):
    t = _table_of(summary, name, where)
    if columns:
        idx = []
        for c in columns:
            _check(c in t["columns"], where, "table %r has no column %r (it has: %s)"
                   % (name, c, " | ".join(t["columns"])))
            idx.append(t["columns"].index(c))
    else:
        idx = list(range(len(t["columns"])))

    def line(cells):
        return "| " + " | ".join(cells) + " |"

    def numeric(k):
        return all(re.fullmatch(r"[-+]?[\d.,]+(e[-+]?\d+)?[x%]?|-|", r[k]) for r in t["rows"])

    out = [line([t["columns"][k] for k in idx]),
           line(["---:" if numeric(k) and k != idx[0] else "---" for k in idx])]
    out += [line([r[k] for k in idx]) for r in t["rows"]]
    return "\n".join(out) + "\n"


def render_meta(summary, rel):
    return ("- run: [`%s`](%s), commit `%s`, %s, on %s\n- command: `%s`\n"
            % (os.path.basename(rel), rel, summary["commit"], summary["date"],
               summary["machine"], summary["command"]))


def render_page(text, page_dir, cache):
    """The page's text with every generated block rewritten from its summary."""
    def summary_at(rel, where):
        path = os.path.normpath(os.path.join(page_dir, rel))
        if path not in cache:
            cache[path] = load_summary(path)
        return cache[path]

    def table(m):
        where = "%s#%s" % (m.group("path"), m.group("table"))
        s = summary_at(m.group("path"), where)
        cols = [c.strip() for c in m.group("columns").split(" | ")] if m.group("columns") else None
        head = m.group(0)[:m.group(0).index("-->") + 4]
        return head + render_table(s, m.group("table"), cols, where) + "<!-- /result -->\n"

    def meta(m):
        s = summary_at(m.group("path"), m.group("path"))
        head = m.group(0)[:m.group(0).index("-->") + 4]
        return head + render_meta(s, m.group("path")) + "<!-- /result-meta -->\n"

    return META_MARKER.sub(meta, MARKER.sub(table, text))


def summaries_cited(text, page_dir):
    paths = [m.group("path") for m in MARKER.finditer(text)]
    paths += [m.group("path") for m in META_MARKER.finditer(text)]
    return sorted({os.path.normpath(os.path.join(page_dir, p)) for p in paths})


def pages(repo):
    out = [os.path.join(repo, "README.md")]
    for root, _, files in os.walk(os.path.join(repo, "docs")):
        out += [os.path.join(root, f) for f in files if f.endswith(".md")]
    return sorted(p for p in out if os.path.exists(p))


# --- Checking ------------------------------------------------------------------------------------

def check(repo=REPO):
    """Every problem found, as messages naming the file; empty when the convention holds
    (perf/results_check.py)."""
    import results_check  # perf/: the checks, apart so that each file stays readable
    return results_check.check(repo)


# --- Command line ------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="The format and the markers: docs/contributing.md")
    ap.add_argument("--repo", default=REPO, help="repository root (default: this file's)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="regenerate every page's blocks from its summaries")
    r.add_argument("pages", nargs="*")
    sub.add_parser("check", help="verify pages, summaries, links, docs/ size and citations")
    s = sub.add_parser("summarize", help="write a summary from a report with pipe tables")
    s.add_argument("--report", required=True)
    s.add_argument("--benchmark", required=True)
    s.add_argument("--command", required=True)
    s.add_argument("--title", default=None)
    s.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "render":
            cache = {}
            for page in args.pages or pages(args.repo):
                with open(page) as f:
                    text = f.read()
                new = render_page(text, os.path.dirname(os.path.abspath(page)), cache)
                if new != text:
                    with open(page, "w") as f:
                        f.write(new)
                    print("rendered %s" % os.path.relpath(page, args.repo))
            return 0
        if args.cmd == "check":
            problems = check(args.repo)
            for p in problems:
                print("results: %s" % p)
            n = len(pages(args.repo))
            print("results: %d pages checked, %d problem(s)" % (n, len(problems)))
            return 1 if problems else 0
        with open(args.report) as f:
            text = f.read()
        summary = make_summary(text, args.benchmark, args.command, args.title or args.benchmark,
                               git_commit(), datetime.date.today().isoformat(), this_machine())
        write_summary(args.out, summary)
        print("wrote %s" % args.out)
        return 0
    except (ResultError, OSError) as e:
        print("results: error: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
