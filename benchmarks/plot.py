"""Draw docs/rbf_fit.png from docs/data/rbf_fit_gpu.json and rbf_peers_cpu.json.

    python benchmarks/plot.py

Left: fit time against N (jfmm on the GPU, set-up and solve; scipy and
ferreus_rbf on a 2-core CPU). Right: relative RMS error at new points.
"""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DOCS = os.path.join(os.path.dirname(__file__), "..", "docs")


def load(name):
    with open(os.path.join(DOCS, "data", name)) as fh:
        return [r for r in json.load(fh) if "error" not in r]


def main():
    ours, peers = load("rbf_fit_gpu.json"), load("rbf_peers_cpu.json")
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
    out = os.path.join(DOCS, "rbf_fit.png")
    fig.savefig(out, dpi=100)
    print(f"saved {out}")


if __name__ == "__main__":
    main()
