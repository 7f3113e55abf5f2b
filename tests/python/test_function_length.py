"""scripts/check_function_length.py: on small synthetic trees in a tmp dir
(the limits' edges, what must not confuse the C++ scanner, docstrings, the
allowlist's three verdicts) and on the real tree against the committed
allowlist."""
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "check_function_length.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import check_function_length as cfl  # noqa: E402


def cxx_function(name, lines, body_line="  x += 1;"):
    """A C++ function of exactly `lines` lines, signature to closing brace."""
    return "int %s(int x) {\n%s\n  return x;\n}\n" % (
        name, "\n".join([body_line] * (lines - 3)))


def py_function(name, lines, docstring_lines=0):
    """A Python function of `lines` lines, not counting its docstring."""
    doc = ""
    if docstring_lines == 1:
        doc = '    """One line."""\n'
    elif docstring_lines:
        doc = '    """Start.\n' + "    more\n" * (docstring_lines - 2) + '    """\n'
    return "def %s(x):\n%s%s    return x\n" % (
        name, doc, "    x += 1\n" * (lines - 2))


def write(root, rel, text):
    path = os.path.join(str(root), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def run(root, *args):
    """(exit status, stdout lines) of the checker on root."""
    p = subprocess.run(
        [sys.executable, SCRIPT, "--root", str(root),
         "--allowlist", os.path.join(str(root), "allow.txt")] + list(args),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    return p.returncode, p.stdout.splitlines()


def lengths(src):
    return {f.name: (f.line, f.length) for f in cfl.scan_cxx(src)}


def test_a_151_line_cxx_function_is_caught_and_a_150_line_one_is_not(tmp_path):
    write(tmp_path, "comm/a.cc", cxx_function("Long", 151) + cxx_function("Fits", 150))
    rc, out = run(tmp_path)
    assert rc == 1
    assert out[:-1] == ["comm/a.cc:1: function Long is 151 lines (limit 150; not in allow.txt)"]
    assert out[-1] == ("function length: 2 C++ and 0 Python functions checked, "
                       "0 allowlisted, 1 problems")
    write(tmp_path, "comm/a.cc", cxx_function("Fits", 150))
    assert run(tmp_path)[0] == 0


def test_only_the_listed_folders_count_and_tests_are_excepted(tmp_path):
    for rel in ("comm/tests/a.cc", "perf/tests/b.py", "docs/c.cc", "comm/d.cpp",
                "tests/perf/e.cc"):
        write(tmp_path, rel, py_function("long", 200) if rel.endswith(".py")
              else cxx_function("Long", 200))
    write(tmp_path, "plugins/torch/x.h", cxx_function("Long", 151))
    rc, out = run(tmp_path)
    assert rc == 1 and len(out) == 2 and out[0].startswith("plugins/torch/x.h:1: ")


def test_braces_in_comments_strings_and_raw_strings_do_not_confuse_it():
    tricky = textwrap.dedent(r'''
        // a comment { with a brace
        int Tricky(int x) {  // {{{
          /* } */ const char* a = "}}\"{";
          const char* b = R"delim(
            } ) " }} {
          )delim";
          const char* c = u8R"(})";
          char d = '}', e = '\'', f = '{';
          long g = 1'000'000 + 0x1'F; int h[] = {1'0, 2};
          /* a block comment over
             lines } } */
        #define CLOSE }
          return x + sizeof(a) + d + e + f + g + (b != c);
        }
        int After() { return '"'; }
        ''').lstrip("\n")
    assert lengths(tricky) == {"Tricky": (2, 13), "After": (15, 1)}


def test_a_lambda_counts_with_its_function_and_not_on_its_own():
    src = textwrap.dedent("""
        namespace fusebox {
        void Outer() {
          auto f = [&](int x) {
            if (x) { return 1; }
            return 2;
          };
          std::thread t([] {
            Work();
          });
        }
        }  // namespace fusebox
        """).lstrip("\n")
    assert lengths(src) == {"Outer": (2, 9)}
    body = "  auto f = [](int y) {\n" + "    y += 1;\n" * 140 + "    return y;\n  };\n"
    long_src = "int Outer(int x) {\n%s  return f(x);\n}\n" % body
    assert lengths(long_src) == {"Outer": (1, 146)}
    long_src = long_src.replace("    return y;\n", "    y += 1;\n" * 6 + "    return y;\n")
    assert lengths(long_src) == {"Outer": (1, 152)}


def test_classes_constructors_and_return_types_are_read():
    src = textwrap.dedent("""
        extern "C" {
        int CFunc(void) { return 0; }
        }
        namespace a::b {
        template <typename T,
                  typename U = std::vector<int>>
        std::function<void(int)>
        Make(T t) {
          return [t](int) {};
        }
        struct alignas(64) Engine::Buffers final : Base<int> {
         public:
          Buffers() : a_{1}, b_(2), c_{Init({3})} {
            Setup();
          }
          ~Buffers() { Free(); }
          bool operator==(const Buffers& o) const { return a_ == o.a_; }
          void operator()() const {}
          int x_{0};
          int y_ = Compute({1, 2});
        };
        const Table kTable = {
          {"a", 1},
        };
        void Guarded() ABSL_LOCKS_EXCLUDED(mu_) {
        }
        }  // namespace a::b
        """).lstrip("\n")
    assert lengths(src) == {
        "CFunc": (2, 1), "Make": (7, 4),
        "Engine::Buffers::Buffers": (13, 3), "Engine::Buffers::~Buffers": (16, 1),
        "Engine::Buffers::operator==": (17, 1), "Engine::Buffers::operator()": (18, 1),
        "Guarded": (25, 2)}


def test_a_python_function_is_measured_without_its_docstring(tmp_path):
    write(tmp_path, "scripts/a.py", py_function("documented", 150, docstring_lines=40)
          + py_function("one_line_doc", 150, docstring_lines=1)
          + py_function("too_long", 151, docstring_lines=3))
    funcs = {f.name: f.length for f in cfl.scan_python(
        open(os.path.join(str(tmp_path), "scripts/a.py")).read())}
    assert funcs == {"documented": 150, "one_line_doc": 150, "too_long": 151}
    rc, out = run(tmp_path)
    assert rc == 1 and len(out) == 2
    assert out[0].startswith("scripts/a.py:") and "function too_long is 151 lines" in out[0]


def test_a_nested_python_function_counts_within_its_parent():
    inner = textwrap.indent(py_function("inner", 100), "    ")
    src = "class C:\n    def outer(self):\n" + textwrap.indent(inner, "    ") + \
        "        return inner\n"
    funcs = {f.name: f.length for f in cfl.scan_python(src)}
    assert funcs == {"C.outer": 102, "C.outer.inner": 100}


def test_a_python_file_in_perf_over_500_lines_is_caught(tmp_path):
    text = "x = 1\n" * 501
    write(tmp_path, "perf/big.py", text)
    write(tmp_path, "tools/big.py", text)
    write(tmp_path, "perf/fits.py", "x = 1\n" * 500)
    rc, out = run(tmp_path)
    assert rc == 1
    assert out[:-1] == ["perf/big.py:1: file is 501 lines (limit 500; not in allow.txt)"]


def test_the_allowlist_passes_listed_offenders_and_fails_grown_and_fixed_ones(tmp_path):
    write(tmp_path, "bucketing/e.cc", cxx_function("Grows", 160) + cxx_function("Shrinks", 170)
          + cxx_function("Stays", 155))
    write(tmp_path, "perf/p.py", py_function("main", 180))
    assert run(tmp_path, "--write-allowlist")[0] == 0
    listed = open(os.path.join(str(tmp_path), "allow.txt")).read()
    assert "may only shrink" in listed
    assert [line for line in listed.splitlines() if not line.startswith("#")] == [
        "bucketing/e.cc:Grows 160", "bucketing/e.cc:Shrinks 170",
        "bucketing/e.cc:Stays 155", "perf/p.py:main 180"]
    rc, out = run(tmp_path)
    assert rc == 0 and out == ["function length: 3 C++ and 1 Python functions checked, "
                               "4 allowlisted, 0 problems"]

    write(tmp_path, "bucketing/e.cc", cxx_function("Grows", 161) + cxx_function("Shrinks", 150)
          + cxx_function("Stays", 155))
    write(tmp_path, "perf/p.py", "x = 1\n")  # main is gone
    rc, out = run(tmp_path)
    assert rc == 1
    assert out == [
        "bucketing/e.cc:1: function Grows is 161 lines, more than its 160 in allow.txt"
        " (limit 150)",
        "allow.txt:8: bucketing/e.cc:Shrinks is now within its limit or gone: remove it"
        " from the list",
        "allow.txt:10: perf/p.py:main is now within its limit or gone: remove it from the list",
        "function length: 3 C++ and 0 Python functions checked, 2 allowlisted, 3 problems"]


def test_a_malformed_allowlist_line_fails(tmp_path):
    write(tmp_path, "allow.txt", "# header\ncomm/a.cc Long\n")
    rc, out = run(tmp_path)
    assert rc == 1 and "allow.txt:2: expected" in out[0]


def test_the_real_tree_passes_against_the_committed_allowlist():
    p = subprocess.run([sys.executable, SCRIPT], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout
    assert p.stdout.startswith("function length: ") and p.stdout.endswith(", 0 problems\n")


def test_the_real_tree_ends_functions_where_ctags_does():
    """Where universal-ctags is installed: every function it finds in the real
    tree, the scanner finds too, ending on the same line and starting no later
    than ctags' line of the name (earlier where the return type has a line of
    its own)."""
    files = sorted(rel for rel in cfl._files(ROOT, cfl.CXX_DIRS, (".cc", ".h")))
    try:
        p = subprocess.run(
            ["ctags", "--language-force=C++", "--kinds-C++=f", "--fields=+ne",
             "--extras=-F", "-x", "--_xformat=%F %n %{end} %N"] + files,
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            timeout=120)
    except OSError:
        pytest.skip("no ctags")
    if p.returncode != 0 or "Universal" not in subprocess.run(
            ["ctags", "--version"], stdout=subprocess.PIPE, text=True).stdout:
        pytest.skip("no universal-ctags")
    ours = {(f.path, f.end): f for f in cfl.measure(ROOT)[0]}
    theirs = [line.split(None, 3) for line in p.stdout.splitlines()]
    assert len(theirs) > 100
    for path, start, end, name in theirs:
        f = ours.get((path, int(end)))
        assert f is not None, (path, start, end, name)
        assert int(start) - 3 <= f.line <= int(start), (path, start, end, name, f.line)
        assert f.name.split("::")[-1].startswith(name.split()[0]), (path, name, f.name)
