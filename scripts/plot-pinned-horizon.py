#!/usr/bin/env python3
"""Plot runs of scripts/bench-pinned-horizon.sh (written with CSV=path) as
one SVG: the producers' inserts per second and their latency p99 (log
scale) every 5 s, one line per run, the pinned phase shaded. No plotting
library: the SVG is written by hand, so the book's figure can be redrawn on
any machine with Python 3.

Usage: scripts/plot-pinned-horizon.py OUT.svg LABEL=RUN.csv [LABEL=RUN.csv ...]
"""

import csv
import math
import sys
from html import escape

COLOURS = ["#c0392b", "#e67e22", "#2471a3", "#1e8449", "#7d3c98"]
W, PANEL_H, LEFT, RIGHT, TOP, GAP = 760, 190, 70, 20, 30, 60


def load(path):
    with open(path) as f:
        return [r for r in csv.DictReader(f)]


def main():
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[2:]):
        sys.exit(__doc__)
    out = sys.argv[1]
    runs = [(a.split("=", 1)[0], load(a.split("=", 1)[1])) for a in sys.argv[2:]]
    t_max = max(int(r["t"]) for _, rows in runs for r in rows)
    pinned = [int(r["t"]) for _, rows in runs for r in rows if r["phase"] == "pinned"]
    pin_from, pin_to = (min(pinned) - 5, max(pinned)) if pinned else (0, 0)
    rate_max = max(float(r["inserts_per_s"]) for _, rows in runs for r in rows) * 1.1
    p99_lo, p99_hi = 1.0, max(
        max(float(r["insert_p99_ms"]) for _, rows in runs for r in rows if r["insert_p99_ms"] != "nan"),
        10.0,
    ) * 2
    # Runs written since the script printed the insert's own latency
    # (INSERT and COMMIT, pgbench's latency less its schedule lag) get a
    # third panel.
    own = any("insert_own_p99_ms" in rows[0] for _, rows in runs if rows)
    panels = 3 if own else 2
    plot_w = W - LEFT - RIGHT
    height = TOP + panels * PANEL_H + (panels - 1) * GAP + 40 + 20 * len(runs)

    def x(t):
        return LEFT + plot_w * t / t_max

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
        f'viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{height}" fill="white"/>',
    ]

    def panel(top, title, value, y_of, ticks):
        parts.append(
            f'<rect x="{x(pin_from):.1f}" y="{top}" width="{x(pin_to) - x(pin_from):.1f}" '
            f'height="{PANEL_H}" fill="#eeeeee"/>'
        )
        parts.append(f'<text x="{LEFT}" y="{top - 8}" font-weight="bold">{escape(title)}</text>')
        parts.append(
            f'<text x="{(x(pin_from) + x(pin_to)) / 2:.1f}" y="{top + 14}" text-anchor="middle" '
            f'fill="#666">horizon pinned</text>'
        )
        for v, label in ticks:
            y = y_of(v)
            parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#dddddd"/>')
            parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        parts.append(
            f'<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL_H}" fill="none" stroke="#999"/>'
        )
        for i, (label, rows) in enumerate(runs):
            points = []
            for r in rows:
                v = value(r)
                if v is not None:
                    points.append(f"{x(int(r['t'])):.1f},{y_of(v):.1f}")
            parts.append(
                f'<polyline fill="none" stroke="{COLOURS[i % len(COLOURS)]}" stroke-width="2" '
                f'points="{" ".join(points)}"/>'
            )

    top1 = TOP
    panel(
        top1,
        "Producers' inserts per second (of 1,500 scheduled)",
        lambda r: float(r["inserts_per_s"]),
        lambda v: top1 + PANEL_H - PANEL_H * min(v, rate_max) / rate_max,
        [(v, f"{v:,.0f}") for v in range(0, int(rate_max) + 1, 500)],
    )
    top2 = TOP + PANEL_H + GAP
    span = math.log10(p99_hi) - math.log10(p99_lo)

    def y_p99(v):
        v = min(max(v, p99_lo), p99_hi)
        return top2 + PANEL_H - PANEL_H * (math.log10(v) - math.log10(p99_lo)) / span

    def p99(r):
        v = r["insert_p99_ms"]
        return None if v == "nan" else float(v)

    ticks = []
    v = 1.0
    while v <= p99_hi:
        ticks.append((v, f"{v:,.0f} ms" if v < 1000 else f"{v / 1000:,.0f} s"))
        v *= 10
    panel(
        top2,
        "Producers' insert latency from its scheduled time (pgbench's), p99 of each 5 s (log scale)",
        p99,
        y_p99,
        ticks,
    )
    last = top2
    if own:
        top3 = top2 + PANEL_H + GAP

        def y_own(v):
            return y_p99(v) - top2 + top3

        def own_p99(r):
            v = r.get("insert_own_p99_ms")
            return None if v in (None, "nan") else float(v)

        panel(
            top3,
            "The insert itself (INSERT and COMMIT), p99 of each 5 s (log scale)",
            own_p99,
            y_own,
            ticks,
        )
        last = top3
    axis_y = last + PANEL_H + 16
    for t in range(0, t_max + 1, 30):
        parts.append(f'<text x="{x(t):.1f}" y="{axis_y}" text-anchor="middle">{t} s</text>')
    for i, (label, _) in enumerate(runs):
        y = axis_y + 20 + 18 * i
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + 24}" y1="{y - 4}" y2="{y - 4}" '
            f'stroke="{COLOURS[i % len(COLOURS)]}" stroke-width="3"/>'
        )
        parts.append(f'<text x="{LEFT + 30}" y="{y}">{escape(label)}</text>')
    parts.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
