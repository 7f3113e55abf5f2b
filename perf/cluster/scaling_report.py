#!/usr/bin/env python3
"""The scaling report, regenerated with one command (root: it
creates network namespaces):

    sudo python3 perf/cluster/scaling_report.py            # ~15 min on 2 cores
    sudo python3 perf/cluster/scaling_report.py --quick    # 2 and 4 hosts, one rate

1. Emulated clusters (perf/cluster/emucluster.py): for each link rate and
   host count, `fusebox-perf allreduce` across the hosts (one rank per host,
   UCX over TCP through tbf-shaped links).
2. The cost model fitted per rate to those runs at every host count
   (`fusebox-tune fit --shared_machine`: a per-link term and one for the
   machine whose cores every emulated host shares), from 1 MiB up (smaller
   collectives run mostly inside the shaper's burst), and once more without
   the largest host count, to report its error there (held out).
3. `fusebox-perf overlap` of the profile on the same clusters: DDP, Horovod,
   MG-WFBP and the online tuner, whose plan per host count goes into the
   policy cache (the knowledge base per cluster size, filled by a real
   procedure); `pred` comes from the model of step 2 (--predict_with), so
   each run validates the simulator at that size.
4. `fusebox-tune scale` for every shipped profile on the ib-400g and 25gbe
   presets (8 ranks per node) and on each fitted emulated network; plots by
   perf/cluster/plot_scaling.py.
5. <out>/README.md: the validation table (iteration time and exposed
   communication, each with its signed error), tuned against the best other
   plan as measured, the cache entries, the simulated scaling efficiencies,
   and the commands that made them; <out>/result.json, its compact summary,
   which a results page cites (docs/results/scaling.md, perf/results.py).
   <out> defaults to build/bench-out/scaling.

    python3 perf/cluster/scaling_report.py --report_only   # step 5 alone, from <out>/raw
"""
import argparse
import csv
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "perf"))
import results as result_summary  # noqa: E402  perf/results.py: the results convention
PY = "/usr/bin/python3"


class Runner:
    def __init__(self, out):
        self.out = out
        self.commands = []

    def run(self, cmd, log=None, check=True, timeout=1800):
        shown = " ".join(shlex.quote(c.replace(REPO + "/", "")) for c in cmd)
        self.commands.append(shown)
        print("$ " + shown, flush=True)
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if log:
            with open(os.path.join(self.out, log), "w") as f:
                f.write(p.stdout + p.stderr)
        if check and p.returncode != 0:
            sys.exit("scaling_report: command failed (exit %d): %s\n%s" %
                     (p.returncode, shown, (p.stdout + p.stderr)[-4000:]))
        print("  (%.0f s)" % (time.monotonic() - t0), flush=True)
        return p


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--out", default=os.path.join(REPO, "build", "bench-out", "scaling"),
                    help="raw runs, README.md (the report) and result.json (its compact summary "
                         "for a results page) (default: %(default)s)")
    ap.add_argument("--hosts", default="2,4,8")
    ap.add_argument("--rates", default="1gbit,4gbit")
    ap.add_argument("--profile", default="resnet50", help="profile replayed on the emulated hosts")
    ap.add_argument("--fit_min_bytes", type=int, default=1 << 20,
                    help="fit the cost model to allreduces of at least this many bytes: below "
                         "about 4x the shaper's 256 KB burst, a rank's traffic passes mostly "
                         "unshaped (perf/cluster/README.md)")
    ap.add_argument("--quick", action="store_true", help="hosts 2,4 and rate 2gbit only")
    ap.add_argument("--report_only", action="store_true",
                    help="rewrite <out>/README.md from <out>/raw without running anything")
    args = ap.parse_args()
    if args.report_only:
        write_report(args.out, args.profile, None)
        return
    if args.quick:
        args.hosts, args.rates = "2,4", "2gbit"
    if os.geteuid() != 0:
        sys.exit("scaling_report: needs root (network namespaces)")
    tools = os.path.join(args.build, "tools")
    perf = os.path.join(args.build, "perf", "fusebox-perf")
    tune = os.path.join(tools, "fusebox-tune")
    for exe in (perf, tune, os.path.join(tools, "fusebox-run")):
        if not os.access(exe, os.X_OK):
            sys.exit("scaling_report: %s not built (bash scripts/build.sh)" % exe)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("scaling_report: the plots need matplotlib: bash scripts/install-deps.sh "
                 "(or apt-get install python3-matplotlib)")
    hosts = sorted({int(h) for h in args.hosts.split(",")})  # the last is held out of a fit
    rates = args.rates.split(",")
    out = args.out
    raw = os.path.join(out, "raw")
    shutil.rmtree(raw, ignore_errors=True)
    os.makedirs(raw)
    cache = os.path.join(raw, "policy-cache")
    r = Runner(out)
    emu = [PY, os.path.join(REPO, "perf", "cluster", "emucluster.py"), "run", "--fusebox_run",
           os.path.join(tools, "fusebox-run"), "--timeout", "900"]

    # 1-2: allreduce across the hosts, the cost model per rate.
    models = {}
    for rate in rates:
        files = []
        for h in hosts:
            j = os.path.join(raw, "allreduce-%s-%dhosts.json" % (rate, h))
            r.run(emu + ["--hosts", str(h), "--rate", rate, "--", perf, "allreduce", "-b", "64K",
                         "-e", "32M", "-f", "4", "-n", "5", "-w", "2", "--progress", "0",
                         "--json", j], log="raw/allreduce-%s-%dhosts.txt" % (rate, h))
            files.append(j)
        models[rate] = os.path.join(raw, "cost-model-%s.json" % rate)
        # Note [Hosts that share a machine] (autotune/cost_model.cc).
        # (One host count cannot tell the machine's bandwidth from the links'.)
        shared = ["--shared_machine"] if len(files) >= 2 else []
        min_bytes = ["--min_bytes", str(args.fit_min_bytes)]
        r.run([tune, "fit", "--from", ",".join(files), "--ranks_per_node", "1"] + shared +
              min_bytes + ["--out", models[rate]], log="raw/fit-%s.txt" % rate)
        if len(files) >= 3:
            r.run([tune, "fit", "--from", ",".join(files[:-1]), "--ranks_per_node", "1",
                   "--shared_machine", "--validate", files[-1]] + min_bytes,
                  log="raw/fit-held-out-%s.txt" % rate)

    # 3: overlap runs, validated against the fitted model; plans cached.
    for rate in rates:
        for h in hosts:
            j = os.path.join(raw, "overlap-%s-%dhosts.json" % (rate, h))
            r.run(emu + ["--hosts", str(h), "--rate", rate, "--", perf, "overlap", "--profile",
                         args.profile, "--compute_scale", "auto", "--plans",
                         "ddp,horovod,mg-wfbp,tuned", "--tune_candidates", "2", "--tune_blocks",
                         "2", "--tune_pairs", "5", "-n", "5", "-w", "1", "--cache_dir", cache, "--network",
                         "emu-" + rate, "--predict_with", models[rate], "--json", j],
                  log="raw/overlap-%s-%dhosts.txt" % (rate, h))
    r.run([os.path.join(tools, "fusebox-cache"), "--dir", cache, "list"], log="raw/cache-list.txt")

    # 4: the scaling simulator and its plots.
    scale_csv = os.path.join(raw, "scale-presets.csv")
    r.run([tune, "scale", "--profiles", "all", "--presets", "ib-400g,25gbe", "--ranks_per_node",
           "8", "--scale_worlds", "1,8,64,512,4096", "--csv", scale_csv, "--json",
           os.path.join(raw, "scale-presets.json")], log="raw/scale-presets.txt")
    emu_csvs = []
    for rate in rates:
        c = os.path.join(raw, "scale-emu-%s.csv" % rate)
        r.run([tune, "scale", "--profiles", args.profile, "--cost_model", models[rate],
               "--ranks_per_node", "1", "--scale_worlds", "1,2,4,8,16,64,512", "--csv", c],
              log="raw/scale-emu-%s.txt" % rate)
        emu_csvs.append((c, "emu-" + rate))
    plots = os.path.join(out, "plots")
    shutil.rmtree(plots, ignore_errors=True)
    for c, label in [(scale_csv, None)] + emu_csvs:
        r.run([PY, os.path.join(REPO, "perf", "cluster", "plot_scaling.py"), c, "--out", plots]
              + (["--network", label] if label else []))

    # 5: the report.
    write_report(out, args.profile, r.commands, quick=args.quick)


def pct(xs, q):
    """The q-quantile of xs (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def read_validation(raw):
    """(rate, hosts, plan, result) for every overlap run in raw/ with a prediction."""
    runs = []
    for name in sorted(os.listdir(raw)):
        if not (name.startswith("overlap-") and name.endswith(".json")):
            continue
        rate, hosts = name[len("overlap-"):-len("hosts.json")].split("-")
        with open(os.path.join(raw, name)) as f:
            d = json.load(f)
        for res in d["results"]:
            if not res.get("predicted_us"):  # the simulator gave no prediction
                print("scaling_report: no prediction for %s in %s" % (res["plan"], name),
                      file=sys.stderr)
                continue
            runs.append((rate, int(hosts), res["plan"], dict(res, model=d.get("model"))))
    runs.sort(key=lambda x: (x[0], x[1]))
    return runs


def fit_summaries(raw):
    """rate -> (model description, fitted error line, held-out error line, whether sizes
    below --min_bytes were left out) from the `fusebox-tune fit` logs in raw/."""
    out = {}
    for name in sorted(os.listdir(raw)):
        if not (name.startswith("fit-") and name.endswith(".txt")) or "held-out" in name:
            continue
        rate = name[len("fit-"):-len(".txt")]
        text = open(os.path.join(raw, name)).read().splitlines()
        model = next((l[2:] for l in text if l.startswith("# fitted:")), "?")
        # "# error, fitted: N sizes, ..." (earlier tools: "# fitted: N sizes, ...").
        fitted = next((l.split(": ", 1)[1] for l in text
                       if l.startswith("# error, fitted: ") or
                       (l.startswith("# fitted: ") and " sizes, " in l)), "")
        held = os.path.join(raw, "fit-held-out-%s.txt" % rate)
        held_out = ""
        if os.path.exists(held):
            held_out = next((l.split(": ", 1)[1] for l in open(held).read().splitlines()
                             if l.startswith(("# error, held out: ", "# held out: "))), "")
        below_min = any("below --min_bytes" in l for l in text)
        out[rate] = (model, fitted, held_out, below_min)
    return out


def write_report(out, profile, commands, quick=False):
    """<out>/README.md from <out>/raw. Exposed communication is the iteration minus the
    replayed compute (which the simulator knows exactly): the quantity the search
    optimises, so its error is reported beside the iteration's, with its sign."""
    raw = os.path.join(out, "raw")
    plots = os.path.join(out, "plots")
    readme = os.path.join(out, "README.md")
    if commands is None:  # --report_only: keep the commands that made raw/
        commands = []
        if os.path.exists(readme):
            text = open(readme).read()
            if "## Commands" in text:
                block = text.split("## Commands", 1)[1].split("```")
                if len(block) >= 2:
                    commands = [c for c in block[1].strip("\n").split("\n") if c]
    validation = read_validation(raw)
    fits = fit_summaries(raw)
    fit_note = ""
    if any("share one machine" in f[0] for f in fits.values()):
        fit_note = ("; with a per-link term and a term for the machine whose cores all the "
                    "emulated hosts share, Note [Hosts that share a machine] in "
                    "autotune/cost_model.cc")
    if any(f[3] for f in fits.values()):
        fit_note += ("; fitted to the sizes from --fit_min_bytes up, as smaller collectives "
                     "pass mostly inside the links' burst")
    models = sorted({res.get("model") for (_, _, _, res) in validation} - {None})
    if len(models) == 1:
        profile = models[0]
    lines = ["# fusebox scaling report", "",
             "Regenerate: `sudo python3 perf/cluster/scaling_report.py%s` (writes this directory); "
             "`python3 perf/cluster/scaling_report.py --report_only` rewrites this file from "
             "`raw/`." % (" --quick" if quick else ""), "",
             "## Validation: predicted vs measured, iteration and exposed communication", "",
             "One rank per emulated host (network namespace), links shaped with tc tbf, UCX over "
             "TCP; `%s` replayed by `fusebox-perf overlap --compute_scale auto`; predicted by "
             "the simulator under the cost model fitted to the allreduce runs at all host counts "
             "of that rate (`raw/cost-model-*.json`%s). Exposed = iteration - replayed compute; "
             "error = (predicted - measured) / measured, negative when the model is optimistic. "
             "The last two columns predict the same run under the allreduce sizes that run timed "
             "itself beside its plans (`fusebox-perf overlap`'s own cost model, the median of "
             "each size over its rounds) instead of the model fitted across host counts: the "
             "simulator's error apart from the fit's."
             % (profile, fit_note), "",
             "| link | hosts | plan | predicted ms | measured ms | error | exposed pred ms | "
             "exposed meas ms | exposed error | exposed pred, in-run t(m) | its error |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    it_err, ex_err, in_run_err = [], [], []
    for (rate, h, plan, res) in validation:
        p, m, c = res["predicted_us"] / 1e3, res["iteration_us"] / 1e3, res["compute_us"] / 1e3
        pe, me = p - c, m - c
        it_err.append((p - m) / m)
        e = (pe - me) / me if me > 0 else float("nan")
        if me > 0:
            ex_err.append(e)
        in_run = "n/a | n/a"
        if res.get("predicted_beside_us", 0) > 0:
            pb = res["predicted_beside_us"] / 1e3 - c
            eb = (pb - me) / me if me > 0 else float("nan")
            if me > 0:
                in_run_err.append(eb)
            in_run = "%.1f | %+.0f%%" % (pb, 100 * eb)
        lines.append("| %s | %d | %s | %.1f | %.1f | %+.1f%% | %.1f | %.1f | %+.0f%% | %s |" % (
            rate, h, plan, p, m, 100 * (p - m) / m, pe, me, 100 * e, in_run))
    if it_err:
        lines += ["", "Over %d runs: iteration |error| median %.1f%%, max %.1f%%; exposed "
                  "communication |error| median %.0f%%, p90 %.0f%%, under-predicted in %d and "
                  "over-predicted in %d (targets for exposed: median <= 20%%, p90 <= 35%%, "
                  "35-65%% on each side). The iteration error is small because compute, which "
                  "the replay fixes, is most of the iteration; the exposed error is the one "
                  "that decides between plans."
                  % (len(it_err), 100 * statistics.median(abs(x) for x in it_err),
                     100 * max(abs(x) for x in it_err), 100 * statistics.median(abs(x) for x in ex_err),
                     100 * pct([abs(x) for x in ex_err], 0.9), sum(x < 0 for x in ex_err),
                     sum(x > 0 for x in ex_err))]
    if fits:
        lines += ["", "The cost model per rate (`raw/fit-*.txt`): its error on the allreduce runs "
                  "it was fitted to, and, fitted again without the largest host count, its error "
                  "there (`raw/fit-held-out-*.txt`: a world size the fit never saw).", "",
                  "| link | model fitted to every host count | fitted | held-out fit: error at "
                  "the largest host count |", "|---|---|---|---|"]
        cell = lambda t: t.replace("|", "\\|")  # a Markdown table cell
        for rate, (model, fitted, held_out, _) in sorted(fits.items()):
            lines.append("| %s | %s | %s | %s |" % (rate, model, cell(fitted) or "n/a",
                                                    cell(held_out) or "n/a"))
    if in_run_err:
        lines += ["", "Under each run's own allreduce times (%d runs): exposed communication "
                  "|error| median %.0f%%, p90 %.0f%%, under-predicted in %d and over-predicted "
                  "in %d." % (len(in_run_err), 100 * statistics.median(abs(x) for x in in_run_err),
                              100 * pct([abs(x) for x in in_run_err], 0.9),
                              sum(x < 0 for x in in_run_err), sum(x > 0 for x in in_run_err))]
    # Tuned against the best other plan, as measured in the same run.
    by_run = {}
    for (rate, h, plan, res) in validation:
        by_run.setdefault((rate, h), {})[plan] = res["iteration_us"] / 1e3
    lines += ["", "## Tuned against the best other plan, measured", "",
              "Each run measures every plan (medians of its iterations); the tuned plan's ratio "
              "to the best plan that is not the tuned one (< 1: tuned is faster). Runs here are "
              "single medians without confidence intervals; a difference within a few percent "
              "is not a finding.", "",
              "| link | hosts | tuned ms | best other | its ms | tuned / best other |",
              "|---|---|---|---|---|---|"]
    for (rate, h), plans in sorted(by_run.items()):
        if "tuned" not in plans or len(plans) < 2:
            continue
        other = min((v, k) for k, v in plans.items() if k != "tuned")
        lines.append("| %s | %d | %.1f | %s | %.1f | %.3f |" % (
            rate, h, plans["tuned"], other[1], other[0], plans["tuned"] / other[0]))
    cache_list = os.path.join(raw, "cache-list.txt")
    if os.path.exists(cache_list):
        lines += ["", "## The policy cache: a plan per cluster size, tuned on the emulated "
                  "clusters", "", "```", open(cache_list).read().rstrip(), "```"]
    scale_csv = os.path.join(raw, "scale-presets.csv")
    if os.path.exists(scale_csv):
        rows = read_csv(scale_csv)
        lines += ["", "## Simulated scaling efficiency at 512 and 4096 ranks (8 per node)", "",
                  "Predictions of the simulator under published presets, not measurements; "
                  "the validation above bounds how far to trust them.", "",
                  "| model | network | world | tuned | DDP default | Horovod default | "
                  "DDP/tuned time |",
                  "|---|---|---|---|---|---|---|"]
        idx = {(x["model"], x["network"], x["world"], x["plan"]): x for x in rows}
        for (model, network, world, plan), x in idx.items():
            if plan != "tuned" or world not in ("512", "4096"):
                continue
            ddp = idx[(model, network, world, "ddp")]
            hvd = idx[(model, network, world, "horovod")]
            lines.append("| %s | %s | %s | %.3f | %.3f | %.3f | %.3f |" % (
                model, network, world, float(x["efficiency"]), float(ddp["efficiency"]),
                float(hvd["efficiency"]), float(ddp["iteration_ms"]) / float(x["iteration_ms"])))
    if os.path.isdir(plots):
        lines += ["", "## Plots", ""]
        for name in sorted(os.listdir(plots)):
            lines.append("![%s](plots/%s)" % (name, name))
    lines += ["", "## Commands", "", "```"] + commands + ["```", ""]
    with open(readme, "w") as f:
        f.write("\n".join(lines))
    result_summary.write_run_summary(out, "\n".join(lines), "scaling_report",
                                     " ".join(["sudo", "python3"] + sys.argv),
                                     "emulated clusters and the scaling simulator")
    print("\n".join(lines[:14 + len(validation) + 3]))
    print("scaling_report: wrote %s" % os.path.relpath(readme, REPO))


if __name__ == "__main__":
    main()
