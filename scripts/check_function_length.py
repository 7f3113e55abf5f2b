#!/usr/bin/env python3
"""Fails when a function is too long, so that the code stays readable.

Limits (LIMIT, FILE_LIMIT below):
  * C++ (*.cc, *.h under comm/, bucketing/, autotune/, perf/, tools/,
    plugins/; anything under a tests/ folder excepted): no function over 150
    lines, counted from the first line of its declaration (return type or
    specifiers; a `template <...>` clause and attributes before them are not
    counted, as a Python decorator is not) to the line of the closing brace of
    its body.
  * Python (*.py under perf/, plugins/, scripts/, tools/, tests/ folders
    excepted): no function over 150 lines, measured with the ast module as
    end_lineno - lineno + 1 less the lines of its own docstring; a nested
    function counts within its parent and is checked on its own too. No
    Python file under perf/ over 500 lines.

Offenders that predate the check are listed in
scripts/function_length_allowlist.txt, one `path:name max-lines` a line.
The check fails on (a) an offender that is not listed, (b) a listed one that
grew beyond its listed length, and (c) a listed entry that is now within the
limit or gone: remove it, the list may only shrink. An entry covers every
function of that name in that file (overloads), each of which must stay
within its length. `--write-allowlist` rewrites the list from today's tree.

How the C++ side measures: a brace-matching scanner, not a compiler. No real
parser is usable here: the libclang Python bindings are not installed,
`clang -Xclang -ast-dump=json` needs each file's compile flags (the build
writes no compile_commands.json) and dumps every included header's AST, and
ctags is not among scripts/install-deps.sh's packages, so a list written on
a machine with it would not match one without. The scanner
  1. blanks comments, string and character literals (with their u8/u/U/L
     prefixes, raw strings R"delim(...)delim" and C++14 digit separators
     such as 1'000) and preprocessor directives, keeping every line break;
  2. walks the tokens with a stack of scopes (file, namespace, extern "C",
     class/struct/union/enum body), collecting each declaration's head up to
     `;` or `{`. A `{` ends a function's head when the head has a parameter
     list `name(...)` at the outer level and is not a class, enum, namespace or
     variable initialiser (`= {...}`, `T x{...}`); braces inside parentheses and
     a constructor's member initialisers `: a_{1}, b_(2)` belong to the head;
  3. matches the body's braces to its closing `}`. Everything inside -
     lambdas, local classes, nested blocks - counts with the enclosing
     function and is not measured on its own.
Known limits: a `#if`/`#else` whose branches each open a brace is seen as two
braces (directives are dropped, both branches kept); a macro that expands to
an opening or closing brace, or that hides a declaration's `;`, misleads the
scanner; a lambda or function-try-block (`f() try {`) at namespace or class
scope is not measured; a function's name is the identifier before its
parameter list, qualified by the classes it is written in (`Engine::Plan`),
so an unusual head (a macro around the name) may be named oddly. The tests
in tests/python/test_function_length.py pin the cases above.

Usage: check_function_length.py [--root DIR] [--allowlist FILE]
                                [--write-allowlist]
Prints one line per problem and a summary line; exits 1 on problems.
"""
import argparse
import ast
import os
import re
import sys

LIMIT = 150
FILE_LIMIT = 500
CXX_DIRS = ("comm", "bucketing", "autotune", "perf", "tools", "plugins")
PY_DIRS = ("perf", "plugins", "scripts", "tools")
PY_FILE_LIMIT_DIRS = ("perf",)
FILE_NAME = "<file>"  # the allowlist's name for a whole file's length
SKIP_DIRS = {"tests", "__pycache__", ".git"}
HEADER = """\
# Functions longer than scripts/check_function_length.py allows (150 lines;
# Python files under perf/: 500 lines, named <file>), as of the day the check
# came in. This list may only shrink: cut a function below the limit and
# remove its line; never add a line or raise a number (the check fails on a
# listed function that grew, and on a line whose function is now short
# enough or gone). Format: path:function-name max-lines
"""

# --------------------------------------------------------------------------
# C++: blanking comments, literals and directives


def _blank(text):
    """Blank out text, keeping its line breaks."""
    return re.sub(r"[^\n]", " ", text)


def _logical_line_end(src, i):
    """The index of the first line break at or after `i` that a backslash does not
    continue (len(src) when there is none)."""
    j = i
    while True:
        k = src.find("\n", j)
        if k == -1:
            return len(src)
        if not src[j:k].rstrip("\r").endswith("\\"):
            return k
        j = k + 1


_PREFIX_RE = re.compile(r"(?:u8|u|U|L)?R?$")
_IDENT_TAIL_RE = re.compile(r"[A-Za-z0-9_]+$")


def _literal_prefix(src, i):
    """The identifier characters right before src[i] (a quote)."""
    m = _IDENT_TAIL_RE.search(src, max(0, i - 64), i)
    return m.group(0) if m else ""


def mask_cxx(src):
    """src with comments, literals and preprocessor directives blanked.

    String literals keep their quotes (`"   "`) so that `extern "C"` is still
    seen; every line break stays where it was, so line numbers hold.
    """
    out = []
    i, n = 0, len(src)
    line_start = True  # only whitespace since the last line break
    while i < n:
        c = src[i]
        if c == "\n":
            out.append(c)
            i += 1
            line_start = True
            continue
        if c in " \t\r\f\v":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":
            # A directive runs to a line break not escaped (a comment in a
            # directive may hide the continuation; rare).
            j = _logical_line_end(src, i)
            out.append(_blank(src[i:j]))
            i = j
            continue
        line_start = False
        if src.startswith("//", i):
            k = _logical_line_end(src, i)  # a line comment ending in a backslash goes on
            out.append(_blank(src[i:k]))
            i = k
            continue
        if src.startswith("/*", i):
            k = src.find("*/", i + 2)
            k = n if k == -1 else k + 2
            out.append(_blank(src[i:k]))
            i = k
            continue
        if c == '"':
            prefix = _literal_prefix(src, i)
            if prefix.endswith("R") and _PREFIX_RE.match(prefix):
                m = re.compile(r'([^()\\\s]{0,16})\(').match(src, i + 1)
                if m:
                    close = ")" + m.group(1) + '"'
                    k = src.find(close, m.end())
                    k = n if k == -1 else k + len(close)
                    out.append('"' + _blank(src[i + 1:k - 1]) + '"')
                    i = k
                    continue
            k = _end_of_quoted(src, i, '"')
            out.append('"' + _blank(src[i + 1:k - 1]) + '"')
            i = k
            continue
        if c == "'":
            prefix = _literal_prefix(src, i)
            if prefix[:1].isdigit():  # a digit separator: 1'000'000
                out.append(" ")
                i += 1
                continue
            k = _end_of_quoted(src, i, "'")
            out.append("'" + _blank(src[i + 1:k - 1]) + "'")
            i = k
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _end_of_quoted(src, i, quote):
    """Index just past the literal opened by src[i] (stops at a line break)."""
    j = i + 1
    n = len(src)
    while j < n:
        c = src[j]
        if c == "\\":
            j += 2
            continue
        if c == quote:
            return j + 1
        if c == "\n":
            return j  # unterminated: stop at the line's end
        j += 1
    return n


# --------------------------------------------------------------------------
# C++: tokens and scopes

_TOKEN_RE = re.compile(
    r"""(?P<id>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<num>\.?[0-9](?:[eEpP][+-]|[A-Za-z0-9_.])*)
      | (?P<str>"[^"\n]*"|'[^'\n]*')
      | (?P<op>::|->\*?|\.\.\.|<=>|<<=?|>>=?|<=|>=|==|!=|&&|\|\||\+\+|--
              |[-+*/%^&|!=]=|[][(){};:,.<>?~!=+\-*/%^&|\#@$\\`])
      | (?P<nl>\n)""",
    re.VERBOSE,
)

CLASS_KEYS = {"class", "struct", "union", "enum"}
NOT_NAMES = {"decltype", "alignas", "noexcept", "throw", "sizeof", "alignof",
             "__attribute__", "__declspec", "static_assert", "requires",
             "return", "if", "for", "while", "switch", "operator"}


class Tok:
    __slots__ = ("text", "line")

    def __init__(self, text, line):
        self.text = text
        self.line = line

    def __repr__(self):
        return "%s@%d" % (self.text, self.line)


def tokenize_cxx(masked):
    toks = []
    line = 1
    for m in _TOKEN_RE.finditer(masked):
        if m.lastgroup == "nl":
            line += 1
            continue
        text = m.group(0)
        toks.append(Tok(text, line))
        line += text.count("\n")  # raw strings span lines
    return toks


def _matching(toks, i, open_, close):
    """Index of the token closing the group that toks[i] opens."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j].text
        if t == open_:
            depth += 1
        elif t == close:
            depth -= 1
            if depth == 0:
                return j
    return len(toks) - 1


def _strip_prefix(head):
    """head less `template <...>` clauses and [[attributes]] at its front."""
    i = 0
    while i < len(head):
        t = head[i].text
        if t == "template" and i + 1 < len(head) and head[i + 1].text == "<":
            depth, j = 0, i + 1
            while j < len(head):
                u = head[j].text
                if u in "([":
                    j = _matching(head, j, u, ")" if u == "(" else "]")
                elif u == "<":
                    depth += 1
                elif u == ">":
                    depth -= 1
                elif u == ">>":
                    depth -= 2
                j += 1
                if depth <= 0:
                    break
            i = j
        elif t == "[" and i + 1 < len(head) and head[i + 1].text == "[":
            i = _matching(head, i, "[", "]") + 1
        elif t in ("export", "extern") and i + 1 < len(head) and head[i + 1].text == "template":
            i += 1
        else:
            break
    return head[i:]


def _outer(head):
    """(index, token) of head's tokens outside (), [] and {} groups."""
    out = []
    i = 0
    while i < len(head):
        t = head[i].text
        out.append((i, head[i]))
        if t in ("(", "[", "{"):
            i = _matching(head, i, t, {"(": ")", "[": "]", "{": "}"}[t])
            out.append((i, head[i]))
        i += 1
    return out


def _function_name(head):
    """(name, index of its parameter list's '(') or None if head is no function."""
    outer = _outer(head)
    candidates = []
    angle = 0  # inside template arguments: std::function<void(int)> f()
    for k, (i, tok) in enumerate(outer):
        before = outer[k - 1][1].text if k else ""
        if tok.text in ("<", ">", ">>") and before != "operator":
            angle = max(0, angle + {"<": 1, ">": -1, ">>": -2}[tok.text])
        if tok.text != "(" or k == 0 or angle:
            continue
        prev = outer[k - 1][1].text
        name = None
        j = k - 1
        if prev == ")" and k >= 2 and outer[k - 2][1].text == "(" and k >= 3 \
                and outer[k - 3][1].text == "operator":
            name, j = "operator()", k - 3
        elif re.match(r"[A-Za-z_]", prev) and prev not in NOT_NAMES:
            name = prev
            if k >= 2 and outer[k - 2][1].text == "operator":
                name, j = "operator " + prev, k - 2
            elif k >= 2 and outer[k - 2][1].text == "~":
                name, j = "~" + prev, k - 2
        elif k >= 2 and outer[k - 2][1].text == "operator":
            name, j = "operator" + prev, k - 2
        elif prev == "]" and k >= 3 and outer[k - 3][1].text == "operator":
            name, j = "operator" + outer[k - 2][1].text + "]", k - 3
        if name is None:
            continue
        while j >= 2 and outer[j - 1][1].text == "::" and \
                re.match(r"[A-Za-z_]", outer[j - 2][1].text):
            name = outer[j - 2][1].text + "::" + name
            j -= 2
        candidates.append((name, i))
    if not candidates:
        return None
    for name, i in candidates:  # a macro before the name: FOO(x) void f()
        if not re.match(r"[A-Z0-9_]+$", name.split("::")[-1]):
            return name, i
    return candidates[0]


def _class_name(texts):
    """The (qualified) name after a class key: Engine::Buffers in
    `struct ALIGNED Engine::Buffers final : Base`."""
    name = ""
    for k, t in enumerate(texts):
        if t in (":", "{", "<") or t == "final":
            break
        if re.match(r"[A-Za-z_]", t) and t not in CLASS_KEYS:
            name = t if k == 0 or texts[k - 1] != "::" else name + "::" + t
    return name


def classify_head(head):
    """What a `{` after head opens: ('namespace'|'extern'|'class', name),
    ('function', name), ('init', None) for a member initialiser's braces,
    or ('data', None)."""
    head = _strip_prefix(head)
    texts = [t.text for _, t in _outer(head)]
    if not texts:
        return ("data", None)
    if "namespace" in texts[:2]:
        return ("namespace", None)
    if texts[0] == "extern" and len(texts) == 2 and texts[1].startswith('"'):
        return ("extern", None)
    if any(t == "=" and (k == 0 or texts[k - 1] != "operator")
           for k, t in enumerate(texts)):
        return ("data", None)
    fn = _function_name(head)
    if fn is None:
        keys = [t for t in texts if t in CLASS_KEYS]
        if keys:
            return ("class", _class_name(texts[texts.index(keys[0]) + 1:]))
        return ("data", None)
    name, paren = fn
    close = _matching(head, paren, "(", ")")
    rest = [t.text for _, t in _outer(head[close + 1:])]
    if ":" in rest and rest[-1:] and re.match(r"[A-Za-z_>]", rest[-1][-1]):
        return ("init", None)  # ctor() : a_{...}: braces of a member
    return ("function", name)


class Function:
    __slots__ = ("path", "name", "line", "end", "length")

    def __init__(self, path, name, line, end):
        self.path, self.name, self.line, self.end = path, name, line, end
        self.length = end - line + 1


def scan_cxx(src, path="<src>"):
    """Every function defined in src (C++), outermost only."""
    toks = tokenize_cxx(mask_cxx(src))
    funcs = []
    scopes = []  # class names ('' for namespaces and extern blocks)
    head = []
    i = 0
    n = len(toks)
    while i < n:
        t = toks[i].text
        if t == ";":
            head = []
        elif t == "}":
            if scopes:
                scopes.pop()
            head = []
        elif t == ":" and len(head) == 1 and head[0].text in (
                "public", "private", "protected"):
            head = []
        elif t in ("(", "["):
            j = _matching(toks, i, t, ")" if t == "(" else "]")
            head.extend(toks[i:j + 1])
            i = j
        elif t == "{":
            kind, name = classify_head(head)
            j = _matching(toks, i, "{", "}")
            if kind == "function":
                start = _strip_prefix(head)[0].line
                qual = "::".join([s for s in scopes if s] + [name])
                funcs.append(Function(path, qual, start, toks[j].line))
                head, i = [], j
            elif kind in ("namespace", "extern", "class"):
                scopes.append((name or "") if kind == "class" else "")
                head = []
            else:  # initialiser braces: part of the head, skip them
                head.extend(toks[i:j + 1])
                i = j
        else:
            head.append(toks[i])
        i += 1
    return funcs


# --------------------------------------------------------------------------
# Python


def _docstring_lines(node):
    body = node.body
    if body and isinstance(body[0], ast.Expr) and \
            isinstance(body[0].value, ast.Constant) and \
            isinstance(body[0].value.value, str):
        return body[0].end_lineno - body[0].lineno + 1
    return 0


def scan_python(src, path="<src>"):
    """Every function in src (Python), nested ones too, named Class.f, f.g."""
    funcs = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                f = Function(path, name, child.lineno, child.end_lineno)
                f.length -= _docstring_lines(child)
                funcs.append(f)
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(src, filename=path), "")
    return funcs


# --------------------------------------------------------------------------
# The tree, the allowlist and the verdict


def _files(root, dirs, exts):
    for d in dirs:
        for here, subdirs, names in os.walk(os.path.join(root, d)):
            subdirs[:] = sorted(s for s in subdirs if s not in SKIP_DIRS)
            for name in sorted(names):
                if name.endswith(exts):
                    yield os.path.relpath(os.path.join(here, name), root)


def _read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def measure(root):
    """(C++ functions, Python functions, Python files' lengths) under root."""
    cxx, py, files = [], [], []
    for rel in _files(root, CXX_DIRS, (".cc", ".h")):
        cxx.extend(scan_cxx(_read(root, rel), rel.replace(os.sep, "/")))
    for rel in _files(root, PY_DIRS, (".py",)):
        src = _read(root, rel)
        rel = rel.replace(os.sep, "/")
        try:
            py.extend(scan_python(src, rel))
        except SyntaxError as e:  # measured as too long: a problem to fix
            py.append(Function(rel, "<syntax error: %s>" % e.msg, e.lineno or 1,
                               (e.lineno or 1) + LIMIT))
        if rel.split("/")[0] in PY_FILE_LIMIT_DIRS:
            files.append(Function(rel, FILE_NAME, 1, src.count("\n")
                                  + (0 if src.endswith("\n") or not src else 1)))
    return cxx, py, files


def offenders(cxx, py, files):
    """{key: [Function over its limit]} keyed path:name."""
    out = {}
    for f in cxx + py:
        if f.length > LIMIT:
            out.setdefault("%s:%s" % (f.path, f.name), []).append(f)
    for f in files:
        if f.length > FILE_LIMIT:
            out.setdefault("%s:%s" % (f.path, f.name), []).append(f)
    return out


def read_allowlist(path):
    """{key: (max lines, line number in the list)}; raises ValueError."""
    entries = {}
    if not os.path.exists(path):
        return entries
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r"(\S.*\S)\s+([0-9]+)$", line)
            if not m or ":" not in m.group(1):
                raise ValueError("%s:%d: expected `path:function-name max-lines`,"
                                 " got %r" % (path, number, line))
            entries[m.group(1)] = (int(m.group(2)), number)
    return entries


def write_allowlist(path, found):
    with open(path, "w", encoding="utf-8") as f:
        f.write(HEADER)
        for key in sorted(found):
            f.write("%s %d\n" % (key, max(g.length for g in found[key])))


def problems(found, entries, allowlist_name):
    """Problem lines: unlisted offenders, grown ones, entries to remove."""
    out = []
    for key in sorted(found):
        limit = FILE_LIMIT if key.endswith(":" + FILE_NAME) else LIMIT
        for f in found[key]:
            what = "file" if f.name == FILE_NAME else "function %s" % f.name
            where = "%s:%d: %s is %d lines" % (f.path, f.line, what, f.length)
            if key not in entries:
                out.append("%s (limit %d; not in %s)" % (where, limit, allowlist_name))
            elif f.length > entries[key][0]:
                out.append("%s, more than its %d in %s (limit %d)"
                           % (where, entries[key][0], allowlist_name, limit))
    for key, (_, number) in sorted(entries.items(), key=lambda e: e[1][1]):
        if key not in found:
            out.append("%s:%d: %s is now within its limit or gone: remove it "
                       "from the list" % (allowlist_name, number, key))
    return out


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(here),
                        help="the repository's root (default: this script's ..)")
    parser.add_argument("--allowlist", default=None,
                        help="default: ROOT/scripts/function_length_allowlist.txt")
    parser.add_argument("--write-allowlist", action="store_true",
                        help="write today's offenders to the allowlist and exit")
    args = parser.parse_args(argv)
    allowlist = args.allowlist or os.path.join(
        args.root, "scripts", "function_length_allowlist.txt")
    cxx, py, files = measure(args.root)
    found = offenders(cxx, py, files)
    if args.write_allowlist:
        write_allowlist(allowlist, found)
        print("function length: wrote %d entries to %s" % (len(found), allowlist))
        return 0
    try:
        entries = read_allowlist(allowlist)
    except ValueError as e:
        print(e)
        return 1
    name = os.path.relpath(allowlist, args.root).replace(os.sep, "/")
    if name.startswith(".."):
        name = allowlist
    lines = problems(found, entries, name)
    for line in lines:
        print(line)
    allowed = sum(1 for key in found if key in entries)
    print("function length: %d C++ and %d Python functions checked, %d allowlisted, "
          "%d problems" % (len(cxx), len(py), allowed, len(lines)))
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
