"""The checks of the results convention (perf/results.py check): every page's generated blocks
match its summaries, the decimal numbers in a results page's prose are in the summaries it
cites, links resolve, no summary or page is an orphan, docs/ stays within its budget, and no
code cites a dated run folder."""
import os
import re

from results import (CODE_DIRS, DATED_FOLDER, DECIMAL, MARKER, MAX_DOCS_BYTES, MAX_DOCS_FILES,
                     META_MARKER, PROVENANCE_DIRS, REPO, ResultError, load_summary, pages,
                     render_page, summaries_cited)


def _prose(text):
    """The page's own words: generated blocks, code and link targets removed."""
    text = MARKER.sub("", text)
    text = META_MARKER.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return text


def _numbers_in(summary):
    pool = set()
    for t in summary["tables"]:
        for r in [t["columns"]] + t["rows"]:
            for c in r:
                pool.update(DECIMAL.findall(c))
    for n in summary.get("notes", []):
        pool.update(DECIMAL.findall(n))
    return pool


def _links(text, page_dir):
    out = set()
    for target in re.findall(r"\]\(([^)\s#]+)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        out.add(os.path.normpath(os.path.join(page_dir, target)))
    return out


def check(repo=REPO):
    """Every problem found, as messages naming the file; empty when the convention holds."""
    problems = []
    cache = {}
    linked = set()
    results_dir = os.path.join(repo, "docs", "results")
    page_summaries = {}
    all_pages = pages(repo)
    for page in all_pages:
        page_dir = os.path.dirname(page)
        rel = os.path.relpath(page, repo)
        with open(page) as f:
            text = f.read()
        try:
            rendered = render_page(text, page_dir, cache)
        except ResultError as e:
            problems.append("%s: %s" % (rel, e))
            continue
        if rendered != text:
            blocks = [m for m in list(MARKER.finditer(text)) + list(META_MARKER.finditer(text))
                      if render_page(m.group(0), page_dir, cache) != m.group(0)]
            names = ", ".join("%s%s" % (m.group("path"),
                                        "#" + m.group("table") if "table" in m.groupdict() else
                                        " (run)") for m in blocks)
            problems.append("%s: a generated block differs from its summary: %s "
                            "(run `python3 perf/results.py render`)" % (rel, names))
        cited = summaries_cited(text, page_dir)
        page_summaries[page] = cited
        linked.update(cited)
        links = _links(text, page_dir)
        linked.update(links)
        for target in sorted(links):
            if not os.path.exists(target):
                problems.append("%s: links to %s, which does not exist"
                                % (rel, os.path.relpath(target, repo)))
    # Numbers in the prose of results pages and of the front page.
    for page in all_pages:
        if page not in page_summaries:
            continue
        is_front = os.path.dirname(page) == repo
        if not (page.startswith(results_dir + os.sep) or is_front):
            continue
        sources = set(page_summaries[page])
        if os.path.basename(page) == "README.md":
            # An index page may quote what the pages it reaches through links show.
            seen, todo = {page}, [page]
            while todo:
                index = todo.pop()
                with open(index) as f:
                    targets = _links(f.read(), os.path.dirname(index))
                for target in targets:
                    if target in page_summaries and target not in seen:
                        seen.add(target)
                        sources.update(page_summaries[target])
                        if os.path.basename(target) == "README.md":
                            todo.append(target)
        pool = set()
        for s in sources:
            pool |= _numbers_in(cache[s])
        with open(page) as f:
            prose = _prose(f.read())
        missing = sorted({n for n in DECIMAL.findall(prose) if n not in pool},
                         key=lambda n: float(n))
        if missing:
            problems.append("%s: %s not in the summaries the page cites (%s)"
                            % (os.path.relpath(page, repo), ", ".join(missing),
                               ", ".join(os.path.relpath(s, repo) for s in sorted(sources))
                               or "none"))
    # Summaries that no page cites, files that no page links, and the size of docs/.
    docs = os.path.join(repo, "docs")
    count, size = 0, 0
    for root, _, files in os.walk(docs):
        for f in files:
            path = os.path.join(root, f)
            count += 1
            size += os.path.getsize(path)
            rel = os.path.relpath(path, repo)
            if path.endswith(".json") and path.startswith(results_dir + os.sep):
                try:
                    load_summary(path)
                except ResultError as e:
                    problems.append(str(e).replace(repo + os.sep, ""))
            if path not in linked:
                problems.append("%s: no page links to it" % rel)
    if count > MAX_DOCS_FILES:
        problems.append("docs/: %d files, more than %d" % (count, MAX_DOCS_FILES))
    if size > MAX_DOCS_BYTES:
        problems.append("docs/: %d bytes, more than %d" % (size, MAX_DOCS_BYTES))
    # Code cites Notes and result pages, never dated run folders.
    for d in CODE_DIRS:
        for root, _, files in os.walk(os.path.join(repo, d)):
            if (os.path.relpath(root, repo).startswith(PROVENANCE_DIRS)
                    or os.path.basename(root) == "__pycache__"):
                continue
            for f in files:
                path = os.path.join(root, f)
                try:
                    with open(path, errors="replace") as fh:
                        for k, line in enumerate(fh, 1):
                            if DATED_FOLDER.search(line):
                                problems.append("%s:%d: cites a dated run folder (cite a result "
                                                "page or a commit)" % (os.path.relpath(path, repo), k))
                except OSError:
                    pass
    return problems
