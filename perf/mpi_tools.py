"""OpenMPI's allreduce peers for perf/bench_allreduce.py, and the statistics that compare
fusebox with the best of them.

Note [Fair MPI peers]. fusebox's allreduce has two paths and each is compared with OpenMPI's
matching call, at OpenMPI's best per size:
  blocking      fusebox-perf -z 1 (AllReduceBlocking)  vs MPI_Allreduce             "mpibest"
  non-blocking  fusebox-perf -z 0 (-n issued, then     vs MPI_Iallreduce x n, then  "mpinbbest"
                waited: throughput)                       MPI_Waitall
  each waited   fusebox-perf -z 0 --wait_each          vs MPI_Iallreduce + MPI_Wait  "mpiwebest"
                (launch-to-done per call)                 per call
(perf/baselines/mpi_allreduce.cc, Note [Timing shapes], has the three shapes.) Each family's
candidates, one mpirun variant each:
  mpi, mpi-aK          MPI_Allreduce: coll/tuned's fixed decision, tuned algorithm K forced
  mpi-<comp>           MPI_Allreduce from another coll component forced first (priority 100):
                       those of COLL_PROVIDES that this OpenMPI has (ompi_info)
  mpinb, mpinb-aK      MPI_Iallreduce (coll/libnbc: tuned has no non-blocking calls), libnbc's
                       iallreduce algorithm K forced (coll_libnbc_iallreduce_algorithm)
  mpiwe, mpiwe-aK      the same, each call waited at once
  ...-ucx...           the same over the UCX PML (--mca pml ucx, pml_ucx_tls/devices any:
                       Debian's openmpi-mca-params.conf disables it, and its default transport
                       list names only InfiniBand and GPU devices)
A variant that needs a component or a PML is probed first (one 8 B call per world size, with
OpenMPI's selection logged): it runs only where OpenMPI selects what it asked for (coll/han,
for one, disqualifies itself on a communicator whose ranks share one node).

Statistics: per size, the family's winner is the candidate with the lowest median time among
those with correct results ("best_of"). The ratio fusebox/MPI (busbw; = MPI time / fusebox
time, > 1 favours fusebox) is taken repeat by repeat against that winner (the runs are
interleaved, so repeat i of both ran minutes apart at most), and its median gets
toolkit.median_ci's distribution-free interval at 1 - 0.05/m, m the number of sizes of the
table (Bonferroni): a size whose interval contains 1.0 is a tie. With too few repeats for
that level (median_ci's widest interval, [min, max], covers 1 - 2^(1-r) for r repeats) no size
can be told apart: it is a tie marked "too few repeats", and repeats_needed says how many.
Picking the winner on the same repeats favours MPI slightly (the least unlucky candidate wins).
"""

import re

from toolkit import median, median_ci

BLOCKING, THROUGHPUT, WAIT_EACH = "blocking", "nonblocking", "wait_each"
FAMILIES = {BLOCKING: "mpibest", THROUGHPUT: "mpinbbest", WAIT_EACH: "mpiwebest"}
FAMILY_LABELS = {
    "mpibest": "MPI_Allreduce, best of every OpenMPI variant run, per size",
    "mpinbbest": "MPI_Iallreduce x -n then MPI_Waitall, best of every variant run, per size",
    "mpiwebest": "MPI_Iallreduce + MPI_Wait per call, best of every variant run, per size",
}
# The fusebox-mpi-allreduce flags of each shape (none for blocking: older builds lack -z).
SHAPE_ARGS = {BLOCKING: [], THROUGHPUT: ["-z", "0"], WAIT_EACH: ["-z", "0", "--wait_each", "1"]}

# coll/tuned's allreduce algorithms (coll_tuned_allreduce_algorithm; 0, its fixed decision, is
# the plain "mpi") and libnbc's iallreduce algorithms (coll_libnbc_iallreduce_algorithm).
TUNED_ALGORITHMS = {1: "basic_linear", 2: "nonoverlapping", 3: "recursive_doubling", 4: "ring",
                    5: "segmented_ring", 6: "rabenseifner"}
LIBNBC_ALGORITHMS = {1: "ring", 2: "binomial", 3: "rabenseifner", 4: "recursive_doubling"}

# What each coll component of OpenMPI 4.1 implements of allreduce, from its module's function
# table: tuned and libnbc are the defaults the plain variants measure; adapt has bcast and
# reduce (and their non-blocking forms) only; sync, monitoring, self and inter wrap others or
# serve other communicators.
COLL_PROVIDES = {"sm": ("allreduce",), "basic": ("allreduce",), "han": ("allreduce",),
                 "ucc": ("allreduce", "iallreduce"), "adapt": ()}
PML_UCX_MCA = ["--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any",
               "--mca", "pml_ucx_devices", "any"]
PROBE_MCA = ["--mca", "coll_base_verbose", "20", "--mca", "pml_base_verbose", "10"]
PROBE_ARGS = ["-b", "8", "-e", "8", "-n", "1", "-w", "0"]


class Variant:
    """One mpirun configuration of fusebox-mpi-allreduce: `mca` goes after mpirun's
    --oversubscribe, SHAPE_ARGS[shape] after the common arguments; `needs` lists the
    ("pml"|"coll", name) that OpenMPI must select for the variant to mean what it says."""

    def __init__(self, key, shape, label, mca=(), needs=()):
        self.key, self.shape, self.label = key, shape, label
        self.mca, self.needs = list(mca), tuple(needs)


def make_variants(tuned, pmls=("ob1",), components=(), nonblocking=True, nb_algorithms=()):
    """The variants in a stable order, keyed by tool name ("mpi" is OpenMPI's default)."""
    out = {}

    def add(key, shape, label, mca=(), needs=()):
        out[key] = Variant(key, shape, label, mca, needs)

    for pml in pmls:
        sfx, note = ("", "") if pml == "ob1" else ("-" + pml, ", pml " + pml)
        pmca = [] if pml == "ob1" else PML_UCX_MCA
        need = () if pml == "ob1" else (("pml", pml),)
        add("mpi" + sfx, BLOCKING, "default" + note, pmca, need)
        for k in tuned:
            add("mpi%s-a%d" % (sfx, k), BLOCKING, "tuned %s%s" % (TUNED_ALGORITHMS[k], note),
                pmca + ["--mca", "coll_tuned_use_dynamic_rules", "1",
                        "--mca", "coll_tuned_allreduce_algorithm", str(k)], need)
        for shape, base in ((THROUGHPUT, "mpinb"), (WAIT_EACH, "mpiwe")) if nonblocking else ():
            add(base + sfx, shape, "libnbc default" + note, pmca, need)
            for k in nb_algorithms:
                add("%s%s-a%d" % (base, sfx, k), shape,
                    "libnbc %s%s" % (LIBNBC_ALGORITHMS[k], note),
                    pmca + ["--mca", "coll_libnbc_iallreduce_algorithm", str(k)], need)
    for comp in components:
        force = ["--mca", "coll_%s_priority" % comp, "100"] + (
            ["--mca", "coll_ucc_enable", "1"] if comp == "ucc" else [])
        calls = COLL_PROVIDES.get(comp, ())
        if "allreduce" in calls:
            add("mpi-" + comp, BLOCKING, "coll/" + comp, force, (("coll", comp),))
        if "iallreduce" in calls and nonblocking:
            add("mpinb-" + comp, THROUGHPUT, "coll/" + comp, force, (("coll", comp),))
            add("mpiwe-" + comp, WAIT_EACH, "coll/" + comp, force, (("coll", comp),))
    return out


def label(variants, key):
    """'mpi-a4' -> 'mpi-a4 (tuned ring)'; a key not among `variants` as it is."""
    v = variants.get(key)
    return "%s (%s)" % (key, v.label) if v else key


def with_mca(argv, mca):
    """argv with `mca` inserted after '--oversubscribe' (after argv[0], mpirun, without it)."""
    at = argv.index("--oversubscribe") + 1 if "--oversubscribe" in argv else 1
    return argv[:at] + list(mca) + argv[at:]


# ----------------------------------------------------------------------------- OpenMPI's output

def parse_ompi_info(text):
    """{framework: [component, ...]} from `ompi_info` lines like
    '  MCA coll: tuned (MCA v2.1.0, API v2.0.0, Component v4.1.4)'."""
    out = {}
    for m in re.finditer(r"^\s*MCA (\w+): (\w+) \(", text, re.M):
        out.setdefault(m.group(1), []).append(m.group(2))
    return out


def world_coll_selection(text):
    """From coll_base_verbose output: {component: (enabled on every rank, reason)} for
    MPI_COMM_WORLD; a component that disqualified itself has its comm_query message."""
    current, enabled, reasons = {}, {}, {}
    for line in text.splitlines():
        pid = re.match(r"\[[^\]]*?(\d+)\]", line)
        pid = pid.group(1) if pid else ""
        m = re.search(r"comm_select: new communicator: (\S+)", line)
        if m:
            current[pid] = m.group(1)
            continue
        m = re.search(r"coll:(\w+):comm_query \(\d+/MPI_COMM_WORLD\): (.*disqualifying myself)",
                      line)
        if m:
            reasons[m.group(1)] = m.group(2)
        m = re.search(r"comm_select: selecting\s+(\w+), priority\s+-?\d+, (Enabled|Disabled)",
                      line)
        if m and current.get(pid) == "MPI_COMM_WORLD":
            enabled.setdefault(m.group(1), []).append(m.group(2) == "Enabled")
    names = set(enabled) | set(reasons)
    return {c: (bool(enabled.get(c)) and all(enabled[c]), reasons.get(c, "not selected"))
            for c in names}


def probe_verdict(needs, rc, text):
    """None when a probe run shows OpenMPI selecting everything in `needs`; else why not."""
    if rc != 0:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("[")
                 and not set(ln.strip()) <= set("-")]
        return "does not start (exit status %d%s)" % (rc, ": " + lines[-1] if lines else "")
    pmls = set(re.findall(r"select: component (\w+) selected", text))
    colls = world_coll_selection(text)
    for kind, name in needs:
        if kind == "pml" and name not in pmls:
            return "pml %s not selected (%s)" % (name, ", ".join(sorted(pmls)) or "none logged")
        if kind == "coll" and not colls.get(name, (False,))[0]:
            return "coll/%s not used on MPI_COMM_WORLD: %s" % (
                name, colls.get(name, (False, "not in the selection log"))[1])
    return None


def check_doc_shape(doc, shape):
    """None when a fusebox-mpi-allreduce JSON says it ran `shape`; else the mismatch (a JSON
    without "shape", from a build before it had -z, is blocking)."""
    got = doc.get("shape", BLOCKING) if isinstance(doc, dict) else None
    return None if got == shape else "ran %s, asked for %s" % (got, shape)


# ----------------------------------------------------------------------------- statistics

def add_best(stats, variants, tools_run, keys):
    """Adds stats[(family, n, b)] for every family with a candidate at (n, b) in `keys`: the
    candidate with the lowest median time among those with no wrong result (all when none is
    correct), with best_of, best_tool, candidates, and samples_time_us/samples_rep: the
    repeat-by-repeat best of all candidates (what the targets' spread uses). Returns the
    [(family, n, b)] added."""
    added = []
    for shape, fam in FAMILIES.items():
        cands_all = [k for k in variants if variants[k].shape == shape and k in tools_run]
        for n, b in keys:
            cands = [(k, stats[(k, n, b)]) for k in cands_all if (k, n, b) in stats]
            if not cands:
                continue
            pool = [c for c in cands if not c[1]["wrong"]] or cands
            k, st = min(pool, key=lambda c: c[1]["time_us"])
            reps = sorted(set.intersection(*[set(c[1].get("samples_rep", [])) for c in pool]))
            per_rep = [min(dict(zip(c[1]["samples_rep"], c[1]["samples_time_us"]))[r]
                           for c in pool) for r in reps]
            stats[(fam, n, b)] = dict(st, best_of=label(variants, k), best_tool=k,
                                      candidates={c: s["time_us"] for c, s in cands},
                                      winner_samples_time_us=st["samples_time_us"],
                                      winner_samples_rep=st.get("samples_rep", []),
                                      samples_time_us=per_rep, samples_rep=reps)
            added.append((fam, n, b))
    return added


def paired_ratios(fb, mpi):
    """fusebox/MPI busbw ratio (MPI time / fusebox time) repeat by repeat, against the MPI
    winner's own samples (winner_samples_*, else samples_*), for repeats both have."""
    t_mpi = dict(zip(mpi.get("winner_samples_rep", mpi.get("samples_rep", [])),
                     mpi.get("winner_samples_time_us", mpi["samples_time_us"])))
    return [t_mpi[r] / t for r, t in zip(fb.get("samples_rep", []), fb["samples_time_us"])
            if t > 0 and t_mpi.get(r, 0) > 0]


def repeats_needed(level):
    """The fewest repeats whose widest median interval, [min, max], covers `level`."""
    r = 1
    while 1 - 2.0 ** (1 - r) < level:
        r += 1
    return r


def ratio_verdict(ratios, sizes_compared, alpha=0.05):
    """The median ratio and its interval at 1 - alpha/sizes_compared (Bonferroni); verdict
    "tie" when the interval contains 1.0 or the repeats cannot reach that level, else
    "fusebox faster" (interval above 1) or "MPI faster"."""
    level = 1 - alpha / max(1, sizes_compared)
    lo, hi, cov = median_ci(ratios, level)
    out = {"ratio": median(ratios), "ci_low": lo, "ci_high": hi, "coverage": cov,
           "level": level, "repeats": len(ratios), "sizes_compared": sizes_compared,
           "too_few_repeats": not ratios or cov < level}
    if out["too_few_repeats"] or lo <= 1.0 <= hi:
        out["verdict"] = "tie"
    else:
        out["verdict"] = "fusebox faster" if lo > 1.0 else "MPI faster"
    return out


def compare(stats, n, sizes, fb_key, family, alpha=0.05):
    """[(size, fusebox stats, MPI family stats, ratio_verdict)] at the sizes of `sizes` where
    both were measured; the correction counts those sizes."""
    both = [(b, stats[(fb_key, n, b)], stats[(family, n, b)]) for b in sizes
            if (fb_key, n, b) in stats and (family, n, b) in stats]
    return [(b, u, m, ratio_verdict(paired_ratios(u, m), len(both), alpha)) for b, u, m in both]


# ----------------------------------------------------------------------------- report

# (title, fusebox tool, MPI family): the comparisons of Note [Fair MPI peers].
COMPARISONS = (("blocking", "ucxz", "mpibest"),
               ("non-blocking, -n calls issued then waited", "ucx", "mpinbbest"),
               ("non-blocking, each call waited at once", "ucxw", "mpiwebest"))


def comparison_section(stats, n, sizes, fmt, alpha=0.05):
    """Markdown lines (one table per comparison of COMPARISONS with data at world size n) and
    their summary. `fmt` has size, time and table: bench_allreduce's formatters."""
    lines, summary = [], []
    for title, fb, fam in COMPARISONS:
        rows = compare(stats, n, sizes, fb, fam, alpha)
        if not rows:
            continue
        v0 = rows[0][3]
        trows, sizes_out = [], []
        for b, u, m, v in rows:
            ci = "[%.2f, %.2f]" % (v["ci_low"], v["ci_high"]) if v["repeats"] else "-"
            trows.append([fmt.size(b), fmt.time(u["time_us"]), fmt.time(m["time_us"]),
                          m["best_of"], "-" if v["ratio"] is None else "%.2fx" % v["ratio"],
                          ci, v["verdict"] + (" (too few repeats)" if v["too_few_repeats"]
                                              else "")])
            sizes_out.append(dict({k: v[k] for k in ("ratio", "ci_low", "ci_high", "coverage",
                                                     "verdict", "too_few_repeats", "repeats")},
                                  bytes=b, fusebox_time_us=u["time_us"],
                                  mpi_time_us=m["time_us"], best_of=m["best_of"]))
        count = {w: sum(1 for r in rows if r[3]["verdict"] == w)
                 for w in ("fusebox faster", "tie", "MPI faster")}
        lines += ["", "### %s: %s vs %s" % (title.capitalize(), fb, fam), "",
                  fmt.table(["size", "%s time us" % fb, "%s time us" % fam, "%s is" % fam,
                             "%s/%s busbw" % (fb, fam), "interval", "verdict"], trows,
                            ["r", "r", "r", "l", "r", "l", "l"]), "",
                  "%s/%s: fusebox busbw over MPI's (MPI time / fusebox time; above 1 favours "
                  "fusebox), the median of the repeat-by-repeat ratios against the size's "
                  "winner. Interval: distribution-free, of that median, at %.2f%% = 1 - %g/%d "
                  "(Bonferroni over the %d sizes of this table; achieved %.2f%% with %d "
                  "repeats); a size whose interval contains 1.0 is a tie. %d fusebox faster, %d "
                  "tie, %d MPI faster." % (fb, fam, 100 * v0["level"], alpha, len(rows),
                                           len(rows), 100 * v0["coverage"], v0["repeats"],
                                           count["fusebox faster"], count["tie"],
                                           count["MPI faster"])]
        if any(r[3]["too_few_repeats"] for r in rows):
            lines += ["", "**Too few repeats for that level: every size is a tie; rerun with "
                         "--repeats %d or more.**" % repeats_needed(v0["level"])]
        summary.append({"comparison": title, "fusebox": fb, "mpi": fam, "nranks": n,
                        "alpha": alpha, "correction": "bonferroni", "sizes_compared": len(rows),
                        "level": v0["level"], "sizes": sizes_out})
    return lines, summary


def candidates_tables(stats, variants, n, rows_b, fmt, unit):
    """Markdown lines: per family with a winner at world size n, every candidate's busbw per
    size, the winner starred."""
    lines = []
    titles = {"mpibest": "OpenMPI allreduce algorithms", "mpinbbest": "OpenMPI MPI_Iallreduce, "
              "-n calls then waited", "mpiwebest": "OpenMPI MPI_Iallreduce, each waited"}
    for shape, fam in FAMILIES.items():
        cols = [k for k in variants if variants[k].shape == shape
                and any((k, n, b) in stats for b in rows_b)]
        arows = []
        for b in rows_b:
            best = stats.get((fam, n, b))
            if not best:
                continue
            row = [fmt.size(b)]
            for k in cols:
                st = stats.get((k, n, b))
                row.append("-" if not st else fmt.bw(st["busbw"]) + (
                    " !%d wrong" % st["wrong"] if st["wrong"] else "") + (
                    " *" if k == best["best_tool"] else ""))
            arows.append(row)
        if len(cols) < 2 or not arows:
            continue
        lines += ["", "### %s, %d %s: busbw (GB/s), * = %s" % (titles[fam], n, unit, fam), "",
                  fmt.table(["size"] + [label(variants, k) for k in cols], arows,
                            ["r"] * (1 + len(cols)))]
    return lines


# ----------------------------------------------------------------------------- set-up

def add_arguments(p):
    """bench_allreduce's options for the variants (an argparse group)."""
    g = p.add_argument_group("OpenMPI variants (Note [Fair MPI peers], perf/mpi_tools.py)")
    g.add_argument("--mpi-pmls", default=None, metavar="PML,...",
                   help="PMLs to run the default and tuned/libnbc variants over: ob1 (OpenMPI's "
                        "choice here) and ucx (default ob1,ucx; ob1 with --emulate); ucx runs "
                        "only where a probe shows it selected")
    g.add_argument("--mpi-components", default="auto", metavar="COMP,...",
                   help="coll components forced first, as variants mpi-COMP (MPI_Allreduce) "
                        "and mpinb-/mpiwe-COMP where they have MPI_Iallreduce: 'auto' "
                        "(default) those of %s that ompi_info lists, '' none; each runs only "
                        "where a probe shows OpenMPI using it" % ",".join(COLL_PROVIDES))
    g.add_argument("--mpi-nb-algorithms", default=",".join(map(str, LIBNBC_ALGORITHMS)),
                   metavar="K,...",
                   help="libnbc iallreduce algorithms run as mpinb-aK and mpiwe-aK (1 ring, 2 "
                        "binomial, 3 rabenseifner, 4 recursive_doubling; default all; '' none)")
    g.add_argument("--no-mpi-nonblocking", dest="mpi_nonblocking", action="store_false",
                   help="skip the MPI_Iallreduce families (mpinb*, mpiwe*)")
    g.add_argument("--ucx-wait-each", default="--wait_each", metavar="FLAGS",
                   help="fusebox-perf's flags for non-blocking calls each waited at once, run as "
                        "tool ucxw and compared with mpiwebest (default --wait_each; '' skips "
                        "ucxw; give flags with '=', e.g. --ucx-wait-each='--wait_each "
                        "--ucx_waiter_window_us 0')")
    g.add_argument("--ompi-info", default="ompi_info", help="for --mpi-components auto")


def finish_arguments(p, args, run_text):
    """Checks and expands the group's options; run_text(argv) -> (rc, text) runs ompi_info.
    Sets args.mpi_variants ({} without the mpi tool) and args.ompi_components."""
    pmls = args.mpi_pmls if args.mpi_pmls is not None else "ob1" if args.emulate else "ob1,ucx"
    args.mpi_pmls = [x.strip() for x in pmls.split(",") if x.strip()]
    if not args.mpi_pmls or any(x not in ("ob1", "ucx") for x in args.mpi_pmls):
        p.error("--mpi-pmls wants ob1 and/or ucx, not %r" % pmls)
    try:
        args.mpi_nb_algorithms = sorted({int(x) for x in args.mpi_nb_algorithms.split(",")
                                         if x.strip()})
    except ValueError:
        p.error("--mpi-nb-algorithms wants integers, e.g. 1,3")
    if any(k not in LIBNBC_ALGORITHMS for k in args.mpi_nb_algorithms):
        p.error("--mpi-nb-algorithms: each of 1-4")
    args.ompi_components = {}
    if "mpi" in args.tools:
        rc, text = run_text([args.ompi_info])
        args.ompi_components = parse_ompi_info(text) if rc == 0 else {}
    if args.mpi_components == "auto":
        comps = [c for c in COLL_PROVIDES if c in args.ompi_components.get("coll", ())]
    else:
        comps = [x.strip() for x in args.mpi_components.split(",") if x.strip()]
        if any(c not in COLL_PROVIDES for c in comps):
            p.error("--mpi-components: each of %s" % ",".join(COLL_PROVIDES))
    args.mpi_components = comps
    args.mpi_variants = make_variants(args.mpi_algorithms, args.mpi_pmls, comps,
                                      args.mpi_nonblocking, args.mpi_nb_algorithms) \
        if "mpi" in args.tools else {}


def probe(variants, keys, ranks, argv_fn, run):
    """Runs one 8 B call per (requirement, world size) for the variants among `keys` that need
    a PML or component; argv_fn(key, n) is a variant's command without the common arguments,
    run(argv, name) -> (rc, text). Returns ({(key, n): why it does not run}, [probe records])."""
    skip, verdicts, records = {}, {}, []
    for k in keys:
        v = variants.get(k)
        if not v or not v.needs:
            continue
        for n in ranks:
            if (v.needs, n) not in verdicts:
                argv = with_mca(argv_fn(k, n), PROBE_MCA) + PROBE_ARGS + SHAPE_ARGS[v.shape]
                rc, text = run(argv, "probe-%s-np%d" % (k, n))
                verdicts[(v.needs, n)] = probe_verdict(v.needs, rc, text)
                records.append({"needs": ["%s %s" % x for x in v.needs], "nranks": n,
                                "variant": k, "runs": verdicts[(v.needs, n)] is None,
                                "why_not": verdicts[(v.needs, n)]})
            if verdicts[(v.needs, n)]:
                skip[(k, n)] = verdicts[(v.needs, n)]
    return skip, records
