"""Draw the figures of docs/BENCHMARKS.md from the benchmarks' JSON files.

    python benchmarks/plot.py [--data docs/data] [--docs docs]

Each figure is drawn when its data files are in --data (else a line says
which are missing) and saved as a PNG in --docs:

  laplace_time.png   3D Laplace time against N, total and tree build, with
                     the direct sum (bench_laplace: laplace_float32.json,
                     laplace_float64.json)
  laplace_error.png  measured error and time against eps (bench_laplace
                     --eps sweeps: laplace_eps_float32.json, _float64.json)
  speedup.png        speed-up over the direct sum against N (the Laplace
                     files) and of every kernel at one N (bench_rbf:
                     kernels_3d.json, kernels_2d.json, kernels_3d_float64.json,
                     kernels_2d_float64.json)
  peers.png          jfmm beside jaxFMM, time against error (bench_peers:
                     peers_float32.json, peers_float64.json)
  rbf_fit.png        RBF fit time and error against N (bench_rbf_fit,
                     bench_rbf_peers: rbf_fit_gpu.json, rbf_peers_cpu.json)
  rbf_user.png       RBF fits as a user's script calls them: the first
                     constructor (its compilation shaded), the same in a
                     second process, a second constructor, an eager refit
                     and evaluation at 10^6 points (bench_rbf_fit --user:
                     rbf_user_gpu.json)
  rbf_first.png      the first RBF constructor in a fresh process and the
                     eager refit, commit by commit (bench_rbf_fit --user:
                     rbf_user_h100.json)
  rbf_cpu_peers.png  RBF fit times on the CPU beside scipy (dense) and
                     ferreus_rbf (bench_rbf_peers --jfmm-sizes:
                     rbf_peers_jfmm_cpu.json)
  crossover.png      eager fmm over direct against N, per case, on the GPU
                     and the CPU (bench_crossover: crossover_gpu.json,
                     crossover_gpu2.json, crossover_cpu.json)
  orders.png         every kernel's time, potential alone and with gradient,
                     before and after the orders followed the outputs asked
                     for, with the measured errors (bench_orders:
                     orders_3d.json, orders_3d_before.json)
  adaptive.png       3D Laplace at 2^20 on cube, sphere, Plummer and
                     clustered points, uniform against adaptive trees
                     (bench_adaptive: adaptive_float32.json,
                     adaptive_float64.json, adaptive_uniform_nonuniform.json)
"""
import argparse
import json
import math
import os

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

DOCS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs"))
DTYPES = ("float32", "float64")
COLOR = {"float32": "C0", "float64": "C3"}


def load(data, name):
    """(environment or None, rows without failed runs) of data/name, or None
    if the file is missing. Reads both the {"environment", "title", "rows"}
    files and the older plain lists of rows."""
    path = os.path.join(data, name)
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        content = json.load(fh)
    env, rows = (None, content) if isinstance(content, list) else (content["environment"],
                                                                  content["rows"])
    return env, [r for r in rows if not r.get("error")]


def load_all(data, names):
    """{name: (environment, rows)} of the files present, and a printed line
    naming the missing ones."""
    found = {name: load(data, name) for name in names}
    missing = [name for name, v in found.items() if v is None]
    if missing:
        print(f"  missing in {data}: {', '.join(missing)}")
    return {name: v for name, v in found.items() if v is not None}


def where(envs) -> str:
    """'device, jax version, date' of each distinct environment."""
    seen = []
    for env in envs:
        if env:
            s = f"{env['device']}, jax {env['jax']}, {env['date']}"
            if s not in seen:
                seen.append(s)
    return "; ".join(seen)


class _Plain(ticker.LogFormatter):
    """Log-axis labels as plain numbers (200, 0.5), not 2x10^2."""

    def _num_to_string(self, x, vmin, vmax):
        return f"{x:g}"


def plain_y(ax):
    """Plain numbers on a log y axis, minor ticks labelled where it spans
    less than about a decade (as matplotlib does)."""
    ax.yaxis.set_major_formatter(_Plain())
    ax.yaxis.set_minor_formatter(_Plain(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def label_points(ax, points):
    """Annotate (x, y, text) points; points within ~15% of each other on
    both (log) axes share one label."""
    groups = []
    for x, y, text in points:
        for g in groups:
            if abs(math.log(x / g[0])) < 0.15 and abs(math.log(y / g[1])) < 0.15:
                g[2].append(text)
                break
        else:
            groups.append([x, y, [text]])
    for x, y, texts in groups:
        ax.annotate(", ".join(texts), (x, y), fontsize=7, textcoords="offset points",
                    xytext=(5, 3))


def save(fig, docs, name):
    out = os.path.join(docs, name)
    os.makedirs(docs, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"saved {out}")


def by_n(rows, points="cube"):
    """Rows of one point distribution, by eps, each sorted by N."""
    groups = {}
    for r in rows:
        if r.get("points", points) == points:
            groups.setdefault(r["eps"], []).append(r)
    return {eps: sorted(g, key=lambda r: r["n"]) for eps, g in groups.items()}


def laplace_time(data, docs):
    files = load_all(data, [f"laplace_{dt}.json" for dt in DTYPES])
    if not files:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 5.5), constrained_layout=True)
    last = None
    for dt in DTYPES:
        if f"laplace_{dt}.json" not in files:
            continue
        for eps, rows in by_n(files[f"laplace_{dt}.json"][1]).items():
            n = [r["n"] for r in rows]
            c = COLOR[dt]
            ax.plot(n, [r["total_ms"] for r in rows], "o-", color=c,
                    label=f"{dt}, eps {eps:g}: fmm (tree build included)")
            ax.plot(n, [r["build_ms"] for r in rows], "s:", color=c, ms=4,
                    label=f"{dt}: tree build")
            direct = [(r["n"], r["direct_ms"]) for r in rows if r.get("direct_ms")]
            if direct:
                ax.plot(*zip(*direct), "^-.", color=c, alpha=0.6, label=f"{dt}: direct sum")
            last = last or (n, rows[-1]["total_ms"])
    if last:       # O(N) through the first curve's largest N
        n, t = last
        ax.plot([n[0], n[-1]], [t * n[0] / n[-1], t], "--", color="gray", lw=1, label="O(N)")
    ax.set(xscale="log", yscale="log", xlabel="N (sources = targets)",
           ylabel="time per call [ms]")
    ax.set_xscale("log", base=2)
    plain_y(ax)
    ax.set_title("3D Laplace, potential and gradient, uniform cube\n"
                 + where(env for env, _ in files.values()), fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, docs, "laplace_time.png")
    return True


def laplace_error(data, docs):
    files = load_all(data, [f"laplace_eps_{dt}.json" for dt in DTYPES])
    if not files:
        return False
    fig, (ax_e, ax_t) = plt.subplots(1, 2, figsize=(11, 4.5), constrained_layout=True)
    eps_all = []
    for dt in DTYPES:
        if f"laplace_eps_{dt}.json" not in files:
            continue
        rows = sorted(files[f"laplace_eps_{dt}.json"][1], key=lambda r: -r["eps"])
        for n in sorted({r["n"] for r in rows}):
            sel = [r for r in rows if r["n"] == n and r.get("points", "cube") == "cube"]
            eps = [r["eps"] for r in sel]
            eps_all += eps
            c = COLOR[dt]
            ax_e.plot(eps, [r["err_phi"] for r in sel], "o-", color=c,
                      label=f"{dt}, N = {n:,}: potential")
            ax_e.plot(eps, [r["err_grad"] for r in sel], "^--", color=c, alpha=0.7,
                      label=f"{dt}, N = {n:,}: gradient")
            ax_t.plot(eps, [r["total_ms"] for r in sel], "o-", color=c, label=f"{dt}, N = {n:,}")
            label_points(ax_t, [(r["eps"], r["total_ms"], f"p={r['order']}") for r in sel])
    if eps_all:
        lo, hi = min(eps_all), max(eps_all)
        ax_e.plot([hi, lo], [hi, lo], ":", color="gray", label="error = eps")
    ax_e.set(xscale="log", yscale="log", xlabel="requested eps",
             ylabel="relative L2 error (1,000 targets)", title="measured error")
    ax_t.set(xscale="log", yscale="log", xlabel="requested eps",
             ylabel="time per call [ms]", title="time (tree build included), p: order")
    plain_y(ax_t)
    for ax in (ax_e, ax_t):
        ax.invert_xaxis()       # tighter eps to the right
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("3D Laplace against eps, potential and gradient, uniform cube; "
                 + where(env for env, _ in files.values()), fontsize=10)
    save(fig, docs, "laplace_error.png")
    return True


KERNEL_FILES = ("kernels_3d.json", "kernels_2d.json", "kernels_3d_float64.json",
                "kernels_2d_float64.json")


def _kernel_name(label: str) -> str:
    """One category for Laplace3D and Laplace2D."""
    return "Laplace" if label.startswith("Laplace") else label


def speedup(data, docs):
    laplace = load_all(data, [f"laplace_{dt}.json" for dt in DTYPES])
    kernels = load_all(data, KERNEL_FILES)
    if not laplace and not kernels:
        return False
    panels = int(bool(laplace)) + int(bool(kernels))
    fig, axes = plt.subplots(1, panels, figsize=(6 + 5.5 * (panels - 1), 4.8),
                             constrained_layout=True, squeeze=False,
                             gridspec_kw={"width_ratios": [1, 1.6][:panels]})
    axes = list(axes[0])
    if laplace:
        ax = axes.pop(0)
        for name, (_, rows) in laplace.items():
            dt = rows[0]["dtype"] if rows else ""
            for eps, sel in by_n(rows).items():
                pts = [(r["n"], r["direct_ms"] / r["total_ms"]) for r in sel if r.get("direct_ms")]
                if pts:
                    ax.plot(*zip(*pts), "o-", color=COLOR.get(dt), label=f"{dt}, eps {eps:g}")
        ax.axhline(1, color="gray", ls="--", lw=1, label="break-even")
        ax.set(xscale="log", yscale="log", xlabel="N (sources = targets)",
               ylabel="direct sum time / fmm time", title="3D Laplace")
        ax.set_xscale("log", base=2)
        plain_y(ax)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    if kernels:
        _kernel_bars(axes.pop(0), kernels)
    fig.suptitle("Speed-up over the direct sum, potential and gradient, uniform points\n"
                 + where(env for env, _ in {**laplace, **kernels}.values()), fontsize=10)
    save(fig, docs, "speedup.png")
    return True


def _kernel_bars(ax, files):
    """Grouped bars: every kernel's speed-up, one bar per file."""
    names = []
    for _, rows in files.values():
        for r in rows:
            if _kernel_name(r["kernel"]) not in names:
                names.append(_kernel_name(r["kernel"]))
    width = 0.8 / len(files)
    direct_n = set()
    for i, (name, (_, rows)) in enumerate(files.items()):
        got = {_kernel_name(r["kernel"]): r["speedup"] for r in rows}
        direct_n |= {r["direct_n"] for r in rows}
        r0 = rows[0]
        xs = [k + (i - (len(files) - 1) / 2) * width for k, nm in enumerate(names) if nm in got]
        ax.bar(xs, [got[nm] for nm in names if nm in got], width,
               hatch="//" if r0["dtype"] == "float64" else None, edgecolor="white",
               label=f"{r0['dim']}D {r0['dtype']} eps {r0['eps']:g}, N = {r0['n']:,}")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    nd = ", ".join(f"{n:,}" for n in sorted(direct_n))
    ax.set(yscale="log", ylabel="direct sum time / fmm time",
           title=f"every kernel (direct sum timed at {nd} points, times (N / {nd})^2)")
    plain_y(ax)
    ax.grid(True, axis="y", which="major", alpha=0.3)
    ax.legend(fontsize=7)


PEER_STYLE = {"jfmm": ("o", "C0"), "jaxFMM": ("s", "C1")}


def peers(data, docs):
    files = load_all(data, [f"peers_{dt}.json" for dt in DTYPES])
    if not files:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), constrained_layout=True)
    panels = (("err_phi", ("phi",), "potential", "potential only"),
              ("err_grad", ("phi, grad", "-grad"), "gradient",
               "with gradient (jfmm: phi and grad; jaxFMM: the field -grad)"))
    for ax, (key, outputs, what, title) in zip(axes, panels):
        labels = []
        for (_, rows) in files.values():
            for r in rows:
                dt = r["dtype"]
                if r["code"] == "jfmm.direct":
                    ax.axhline(r["time_ms"], color="gray", ls="--" if dt == "float32" else ":",
                               lw=1, label=f"direct sum, {dt}")
                    continue
                if r["outputs"] not in outputs or r.get(key) is None:
                    continue
                marker, color = PEER_STYLE.get(r["code"], ("x", "k"))
                name = r["code"] + (f" {r['version']}" if r.get("version") else "")
                ax.plot(r[key], r["time_ms"], marker, color=color, ms=7,
                        mfc=color if dt == "float32" else "none", label=f"{name}, {dt}")
                labels.append((r[key], r["time_ms"], r["setting"]))
        label_points(ax, labels)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))            # one legend entry per label
        ax.legend(unique.values(), unique.keys(), fontsize=7)
        ax.set(xscale="log", yscale="log", xlabel=f"relative L2 error of the {what}",
               ylabel="time per call [ms]", title=title)
        ax.title.set_fontsize(10)
        plain_y(ax)
        ax.grid(True, which="major", alpha=0.3)
    n = {r["n"] for _, rows in files.values() for r in rows}
    fig.suptitle(f"jfmm beside jaxFMM, 3D Laplace, N = {', '.join(f'{v:,}' for v in sorted(n))}"
                 f" uniform cube (filled: float32, open: float64); "
                 + where(env for env, _ in files.values()), fontsize=10)
    save(fig, docs, "peers.png")
    return True


def rbf_fit(data, docs):
    files = load_all(data, ["rbf_fit_gpu.json", "rbf_peers_cpu.json"])
    if len(files) < 2:
        return False
    ours, peers = files["rbf_fit_gpu.json"][1], files["rbf_peers_cpu.json"][1]
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for kernel, marker in (("linear", "o"), ("thin_plate_spline", "s")):
        rows = sorted((r for r in ours if r["kernel"] == kernel), key=lambda r: r["n"])
        n = [r["n"] for r in rows]
        ax_t.plot(n, [r["construct_s"] for r in rows], marker + "-", label=f"jfmm H100 {kernel}")
        ax_e.plot(n, [r["rms_error"] for r in rows], marker + "-", label=f"jfmm {kernel}")
        for peer, style in (("scipy", ":"), ("ferreus_rbf", "--")):
            rows = sorted((r for r in peers if r["kernel"] == kernel and
                           r["peer"].startswith(peer)), key=lambda r: r["n"])
            if rows:
                n = [r["n"] for r in rows]
                ax_t.plot(n, [r["fit_s"] for r in rows], marker + style, alpha=0.7,
                          label=f"{peer} CPU {kernel}")
                ax_e.plot(n, [r["rms_error"] for r in rows], marker + style, alpha=0.7,
                          label=f"{peer} {kernel}")
    ax_t.set(xscale="log", yscale="log", xlabel="N data points", ylabel="fit time [s]",
             title="fit (tree, preconditioner, solve; float64, residual 1e-6)")
    ax_e.set(xscale="log", yscale="log", xlabel="N data points",
             ylabel="relative RMS error at new points", title="3D Franke-type data")
    ax_t.legend(fontsize=7)
    ax_e.legend(fontsize=7)
    save(fig, docs, "rbf_fit.png")
    return True


def rbf_first(data, docs):
    found = load(data, "rbf_user_h100.json")
    if found is None:
        return False
    rows = found[1]
    commits = list(dict.fromkeys(r["commit"] for r in rows))
    cases = sorted({(r["kernel"], r["n"]) for r in rows}, key=lambda c: (c[1], c[0]))
    at = {(r["commit"], r["kernel"], r["n"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    width = 0.8 / len(commits)
    for ax, key, label in ((axes[0], "construct_s", "first constructor, fresh process"),
                           (axes[1], "refit_s", "eager refit")):
        for k, commit in enumerate(commits):
            xs = [i + (k - len(commits) / 2 + 0.5) * width for i in range(len(cases))]
            got = [at.get((commit, *c)) for c in cases]
            ax.bar(xs, [r[key] if r else 0.0 for r in got], width, label=commit, color=f"C{k}")
            if key == "construct_s":
                ax.bar(xs, [r["construct_compile_s"] if r else 0.0 for r in got], width,
                       color="none", edgecolor="k", hatch="//",
                       label="of which compiling" if k == 0 else None)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels([f"{kernel}\nN = {n:,}" for kernel, n in cases], fontsize=8)
        ax.set(ylabel="seconds", title=label)
    axes[0].legend(fontsize=8)
    fig.suptitle("RBFInterpolator, float64, residual 1e-6, uniform 3D points: "
                 f"{rows[0]['device']}, jax {rows[0]['jax']}")
    save(fig, docs, "rbf_first.png")
    return True


def rbf_user(data, docs):
    found = load(data, "rbf_user_gpu.json")
    if found is None:
        return False
    device = found[1][0]["device"]            # one card's rows
    rows = [r for r in found[1] if r.get("points", "uniform") == "uniform"
            and r["device"] == device]
    # the last row of each case and process (rows of later commits follow)
    first = {(r["kernel"], r["n"]): r for r in rows if r["process"] == 0}
    second = {(r["kernel"], r["n"]): r for r in rows if r["process"] == 1}
    # a second process counts beside the first only when it ran the same code
    second = {c: r for c, r in second.items() if r.get("commit") == first[c].get("commit")}
    cases = sorted(first, key=lambda c: (c[1], c[0]))
    bars = (("first constructor", lambda r, c: r["construct_s"]),
            ("the same, second process", lambda r, c: second[c]["construct_s"]
             if c in second else 0.0),
            ("second constructor", lambda r, c: r["construct_again_s"]),
            ("eager refit", lambda r, c: r["refit_s"]),
            ("evaluate 10^6 points", lambda r, c: r["evaluate_1000000_s"]))
    fig, ax = plt.subplots(figsize=(11, 4), constrained_layout=True)
    width = 0.8 / len(bars)
    for k, (label, value) in enumerate(bars):
        xs = [i + (k - len(bars) / 2 + 0.5) * width for i in range(len(cases))]
        ax.bar(xs, [value(first[c], c) for c in cases], width, label=label, color=f"C{k}")
        if k == 0:
            ax.bar(xs, [first[c]["construct_compile_s"] for c in cases], width, color="none",
                   edgecolor="k", hatch="//", label="of which compiling")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"{kernel}\nN = {n:,}\n({first[(kernel, n)].get('commit', '')})"
                        for kernel, n in cases])
    ax.set(ylabel="seconds", title="RBFInterpolator as a user calls it (float64, residual "
           "1e-6, uniform 3D points)\n" + f"{rows[0]['device']}, jax {rows[0]['jax']}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save(fig, docs, "rbf_user.png")
    return True


def crossover(data, docs):
    files = load_all(data, ["crossover_gpu.json", "crossover_gpu2.json", "crossover_cpu.json"])
    if not files:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), constrained_layout=True, sharey=True)
    for ax, names, where_ in ((axes[0], ("crossover_gpu.json", "crossover_gpu2.json"), "GPU"),
                              (axes[1], ("crossover_cpu.json",), "CPU")):
        cases, envs = {}, []
        for name in names:
            if name in files:
                envs.append(files[name][0])
                for r in files[name][1]:
                    key = f"{r['dim']}D {_kernel_name(r['kernel'])} {r['dtype']} eps {r['eps']:g}"
                    cases.setdefault(key, {})[r["n"]] = r       # a later run replaces
        for i, (key, rows) in enumerate(sorted(cases.items())):
            rows = [rows[n] for n in sorted(rows)]
            n = [r["n"] for r in rows]
            ax.plot(n, [r["ratio"] for r in rows], "o-", color=f"C{i}", ms=4, label=key)
            auto = [(r["n"], r["auto_ms"] / r["direct_ms"]) for r in rows if r.get("auto_ms")]
            if auto:
                ax.plot(*zip(*auto), "x:", color=f"C{i}", ms=5)
        ax.axhline(1.0, color="gray", lw=1)
        ax.set(xscale="log", yscale="log", xlabel="N (sources = targets)",
               title=f"{where_}: {where(envs)}")
        ax.set_xscale("log", base=2)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=6)
    axes[0].set_ylabel("time / direct sum time (o: FMM, x: default call)")
    plain_y(axes[0])
    fig.suptitle("Repeated eager calls, potential, uniform points: where the FMM overtakes "
                 "the direct sum", fontsize=10)
    save(fig, docs, "crossover.png")
    return True


def orders(data, docs):
    found = load_all(data, ["orders_3d_before.json", "orders_3d.json"])
    if len(found) < 2:
        return False
    (env0, before), (env1, after) = found["orders_3d_before.json"], found["orders_3d.json"]
    key = lambda r: (r["kernel"], r["dtype"], r["gradient"])           # noqa: E731
    old = {key(r): r for r in before}
    cases = [(dt, g) for dt in DTYPES for g in (False, True)]
    fig, axes = plt.subplots(1, len(cases), figsize=(16, 5), constrained_layout=True,
                             sharey=True)
    for ax, (dt, g) in zip(axes, cases):
        rows = [r for r in after if r["dtype"] == dt and r["gradient"] == g and key(r) in old]
        y = np.arange(len(rows))
        ax.barh(y + 0.2, [old[key(r)]["total_ms"] for r in rows], 0.4, color="0.7",
                label="before")
        ax.barh(y - 0.2, [r["total_ms"] for r in rows], 0.4, color=COLOR[dt], label="after")
        for yi, r in zip(y, rows):
            err = max(r["err_phi"], r["err_grad"] or 0.0)
            ax.text(r["total_ms"], yi - 0.2, f" n={r['order']}, {err:.0e}", va="center",
                    fontsize=7)
        ax.set_yticks(y, [r["kernel"] for r in rows])
        ax.invert_yaxis()
        eps = rows[0]["eps"] if rows else 0
        ax.set(xlabel="ms (plan update + apply)",
               title=f"{dt}, eps {eps:g}, {'potential and gradient' if g else 'potential'}")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Orders for the outputs asked for, N = 2^20 uniform 3D; labels: order, "
                 "larger measured error; " + where([env0, env1]), fontsize=10)
    save(fig, docs, "orders.png")
    return True


def adaptive(data, docs):
    found = load_all(data, ["adaptive_float32.json", "adaptive_float64.json",
                            "adaptive_uniform_nonuniform.json"])
    if "adaptive_float32.json" not in found:
        return False
    # the uniform tree on non-uniform points, from its own (slow) run
    extra = found.pop("adaptive_uniform_nonuniform.json", (None, []))[1]
    kinds = ("cube", "sphere", "plummer", "clusters")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True)
    bars = [("adaptive_float32.json", "uniform", "uniform tree", "0.6"),
            ("adaptive_float32.json", "adaptive", "adaptive tree", "C1")]
    panels = [(axes[0], bars, "float32, eps 1e-5"),
              (axes[1], [("adaptive_float64.json", "uniform", "uniform tree", "0.6"),
                         ("adaptive_float64.json", "adaptive", "adaptive tree", "C1")],
               "float64, eps 1e-8")]
    for ax, series, title in panels:
        width = 0.8 / len(series)
        for i, (name, tree, label, color) in enumerate(series):
            if name not in found:
                continue
            dtype = found[name][1][0]["dtype"]
            rows = {r["points"]: r for r in extra + found[name][1]
                    if r["tree"] == tree and r["dtype"] == dtype}
            x = [k for k, kind in enumerate(kinds) if kind in rows]
            ys = [rows[kinds[k]]["total_ms"] for k in x]
            pos = np.array(x) + (i - (len(series) - 1) / 2) * width
            ax.bar(pos, ys, width, color=color, label=label)
            for xp, k, y in zip(pos, x, ys):
                r = rows[kinds[k]]
                ax.text(xp, y, f"{y:.0f}\n{max(r['err_phi'], r['err_grad']):.0e}",
                        ha="center", va="bottom", fontsize=6)
        ax.set_yscale("log")
        plain_y(ax)
        ax.set_xticks(range(len(kinds)), kinds)
        ax.set(ylabel="ms (tree build + potential and gradient)", title=title)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("3D Laplace, N = 2^20: uniform and adaptive trees (labels: ms, larger "
                 "measured error); " + where(env for env, _ in found.values())
                 + "; uniform tree on sphere, Plummer, clusters: an earlier run", fontsize=10)
    save(fig, docs, "adaptive.png")
    return True


def adaptive_jit(data, docs):
    found = load_all(data, ["adaptive_jit_float32.json", "adaptive_jit_float64.json"])
    if not found:
        return False
    kinds = ("cube", "plummer", "clusters")
    calls = [("eager_ms", "eager jfmm.fmm", "0.6"), ("jit_ms", "jax.jit(jfmm.fmm)", "C1"),
             ("grad_ms", "jax.jit(jax.grad(energy))", "C0")]
    panels = [(name, rows) for name, (_, rows) in found.items()]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8),
                             constrained_layout=True, squeeze=False)
    for ax, (name, rows) in zip(axes[0], panels):
        n = 2 ** 20 if any(r["n"] == 2 ** 20 for r in rows) else rows[0]["n"]
        rows = {r["points"]: r for r in rows if r["n"] == n}
        x = [k for k, kind in enumerate(kinds) if kind in rows]
        width = 0.8 / len(calls)
        for i, (key, label, color) in enumerate(calls):
            ys = [rows[kinds[k]][key] for k in x]
            pos = np.array(x) + (i - 1) * width
            ax.bar(pos, ys, width, color=color, label=label)
            for xp, y in zip(pos, ys):
                ax.text(xp, y, f"{y:.1f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [f"{kinds[k]}\n({rows[kinds[k]]['tree']})" for k in x])
        r0 = next(iter(rows.values()))
        ax.set(ylabel="ms (potential and gradient; grad: energy's w.r.t. points)",
               title=f"{r0['dtype']}, eps {r0['eps']:g}, N = {n:,}")
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("3D Laplace as users call it: traced points on bounded adaptive trees "
                 "(x labels: the tree jit took, crowding); " + where(env for env, _ in
                                                                     found.values()),
                 fontsize=10)
    save(fig, docs, "adaptive_jit.png")
    return True


def multi(data, docs):
    found = load_all(data, ["multi_emulated.json", "multi_emulated_plummer.json", "multi.json",
                            "multi_emulated_ring.json", "multi_emulated_allgather_h200.json",
                            "multi_ring_h200x2.json", "multi_h200x4.json"])
    if "multi_emulated.json" not in found:
        return False
    fig, ax = plt.subplots(figsize=(8.5, 5.2), constrained_layout=True)
    series = [("multi_emulated.json", "C0", "cube, uniform tree, points gathered", 5),
              ("multi_emulated_plummer.json", "C1", "Plummer, adaptive tree", -12),
              ("multi_emulated_allgather_h200.json", "C4", "cube, points gathered", 5),
              ("multi_emulated_ring.json", "C2", "cube, each device its share", -12)]
    for name, color, label, dy in series:
        if name not in found:
            continue
        rows = [r for r in found[name][1] if r["scaling"] == "emulated"]
        one = next(r for r in found[name][1] if r["scaling"] == "no mesh")
        d = np.array([r["devices"] for r in rows])
        ax.plot(d, one["apply_ms"] / d, ":", color=color)
        ax.plot(d, [r["shard_ms"] for r in rows], "o-", color=color,
                label=f"{label}, N = {one['n']:,}, {found[name][0]['device']}: slowest "
                      f"share (dotted: perfect)")
        for r in rows:
            ax.annotate(f"{r['shard_ms']:.1f} ms, {r['mb_in']:.0f} MB in",
                        (r["devices"], r["shard_ms"]), textcoords="offset points",
                        xytext=(4, dy), fontsize=7)
    measured = [("multi.json", "C3", "points gathered"),
                ("multi_ring_h200x2.json", "C5", "each device its share"),
                ("multi_h200x4.json", "C6", "each device its share")]
    for name, color, label in measured:
        if name in found:
            strong = [r for r in found[name][1] if r["scaling"] == "strong"]
            ax.plot([r["devices"] for r in strong], [r["apply_ms"] for r in strong], "s-",
                    color=color, label=f"{label}: apply measured on meshes of up to "
                                       f"{strong[-1]['devices']} {found[name][0]['device']}s, "
                                       f"N = {strong[0]['n']:,}")
    ax.set(xscale="log", yscale="log", xlabel="devices",
           ylabel="ms of one device's share (potential and gradient)")
    ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    plain_y(ax)
    ax.legend(fontsize=7)
    ax.set_title("3D Laplace, float32, eps 1e-5: a device's share of the sharded sum, "
                 "emulated on one GPU and measured on a mesh\n"
                 + where(env for env, _ in found.values()),
                 fontsize=8)
    save(fig, docs, "multi.png")
    return True


def scaling(data, docs):
    """Strong and weak scaling measured on a mesh of GPUs (bench_multi.py)."""
    found = load_all(data, ["multi_h200x4.json", "multi_plummer_h200x4.json"])
    if "multi_h200x4.json" not in found:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), constrained_layout=True)
    ax = axes[0]
    for name, color, label in (("multi_h200x4.json", "C0", "cube, uniform tree"),
                               ("multi_plummer_h200x4.json", "C1", "Plummer, adaptive tree")):
        if name not in found:
            continue
        rows = [r for r in found[name][1] if r["scaling"] == "strong"]
        d = np.array([r["devices"] for r in rows])
        ax.plot(d, rows[0]["total_ms"] / d, ":", color=color)
        ax.plot(d, [r["total_ms"] for r in rows], "o-", color=color,
                label=f"{label}, N = {rows[0]['n']:,} (dotted: perfect)")
        for r in rows:
            ax.annotate(f"{r['total_ms']:.1f} ms ({r['efficiency']:.2f})",
                        (r["devices"], r["total_ms"]), textcoords="offset points",
                        xytext=(5, 4), fontsize=7)
    ax.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="ms a call",
           title="strong scaling")
    ax = axes[1]
    rows = [r for r in found["multi_h200x4.json"][1] if r["scaling"] == "weak"]
    d = np.array([r["devices"] for r in rows])
    ax.plot(d, [r["total_ms"] for r in rows], "o-", color="C0",
            label=f"cube, {rows[0]['n']:,} points a GPU, uniform tree")
    ax.plot(d, [rows[0]["total_ms"]] * len(d), ":", color="C0")
    for r in rows:
        ax.annotate(f"{r['total_ms']:.1f} ms ({r['efficiency']:.2f}), depth {r['depth']}",
                    (r["devices"], r["total_ms"]), textcoords="offset points",
                    xytext=(-30, 6), fontsize=7)
    ax.set(xscale="log", xlabel="GPUs", ylabel="ms a call", title="weak scaling",
           ylim=(0, 1.25 * max(r["total_ms"] for r in rows)))
    for ax in axes:
        ax.set_xticks([1, 2, 4], ["1", "2", "4"])
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.legend(fontsize=7, loc="lower left" if ax is axes[0] else "upper left")
    plain_y(axes[0])
    fig.suptitle("3D Laplace, float32, eps 1e-5, potential and gradient: the jitted "
                 "plan.update(x).apply(q) on a mesh of GPUs (efficiency in brackets)\n"
                 + where(env for env, _ in found.values()), fontsize=8)
    save(fig, docs, "scaling.png")
    return True


def compile_stages(data, docs):
    found = load(data, "compile_stages_h100.json")
    if found is None:
        return False
    env, rows = found
    trees = [r for r in rows if "tree" in r and "pass" not in r]
    steps = [r for r in rows if "pass" in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
    ax = axes[0]
    names = [r["tree"] for r in trees]
    parts = (("trace_s", "trace", "C0"), ("pallas_s", "lower: Pallas kernels", "C1"),
             ("lower_rest", "lower: the rest", "C2"), ("xla_s", "XLA", "C3"))
    left = [0.0] * len(trees)
    for key, label, color in parts:
        width = [r["lower_s"] - (r["pallas_s"] or 0.0) if key == "lower_rest" else r[key] or 0.0
                 for r in trees]
        ax.barh(names, width, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, width)]
    ax.invert_yaxis()
    ax.set(xlabel="seconds", title="jax.jit(fmm)'s first call by stage, tree=")
    ax.legend(fontsize=8)
    axes[1].barh([r["pass"] for r in steps], [r["compile_s"] for r in steps], color="C4")
    axes[1].invert_yaxis()
    axes[1].set(xlabel="seconds", title="each pass of the traced adaptive tree compiled alone")
    n = trees[0]["n"]
    fig.suptitle(f"Compilation, 3D Laplace, N = {n:,} float32 eps 1e-5, potential and gradient: "
                 f"{where([env])}", fontsize=10)
    save(fig, docs, "compile_stages.png")
    return True


def rbf_cpu_peers(data, docs):
    found = load(data, "rbf_peers_jfmm_cpu.json")
    if found is None:
        return False
    rows = found[1]
    ours = {(r["kernel"], r["n"]): r for r in rows if r["peer"] == "jfmm"}
    cases = sorted(ours, key=lambda c: (c[1], c[0]))
    colours = {"scipy": "C1", "ferreus_rbf": "C2", "jfmm, first fit in the process": "C9",
               "jfmm, a later fit": "C0"}
    fig, ax = plt.subplots(figsize=(10, 4), constrained_layout=True)
    seen = set()
    for i, case in enumerate(cases):
        got = [(r["peer"], r["fit_s"]) for r in rows
               if (r["kernel"], r["n"]) == case and r["peer"] != "jfmm"]
        got += [("jfmm, first fit in the process", ours[case]["first_fit_s"]),
                ("jfmm, a later fit", ours[case]["fit_s"])]
        for k, (label, seconds) in enumerate(got):
            x = i + (k - len(got) / 2 + 0.5) * 0.25
            ax.bar(x, seconds, 0.25, color=colours[label], label=None if label in seen else label)
            ax.annotate(f"{seconds:.1f}", (x, seconds), ha="center", fontsize=7,
                        textcoords="offset points", xytext=(0, 2))
            seen.add(label)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"{kernel}\nN = {n:,}\n(jfmm: {ours[(kernel, n)]['method']})"
                        for kernel, n in cases], fontsize=8)
    ax.set(ylabel="seconds to fit", title="RBF fits on a 2-core CPU (float64, 3D uniform "
           "points; jfmm and ferreus_rbf at residual 1e-6, scipy's dense LU)")
    ax.legend(fontsize=8, loc="upper left")
    save(fig, docs, "rbf_cpu_peers.png")
    return True


FIGURES = (laplace_time, laplace_error, speedup, peers, rbf_fit, rbf_user, rbf_first,
           rbf_cpu_peers, crossover,
           orders, adaptive, adaptive_jit, multi, scaling, compile_stages)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join(DOCS, "data"),
                    help="folder of the benchmarks' JSON files")
    ap.add_argument("--docs", default=DOCS, help="folder the PNGs are written to")
    args = ap.parse_args()
    for figure in FIGURES:
        print(f"{figure.__name__}:")
        if not figure(args.data, args.docs):
            print("  skipped: no data")


if __name__ == "__main__":
    main()
