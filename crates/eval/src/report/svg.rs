//! SVG bar plots of a statistic per method, with their bootstrap intervals.

use crate::metrics::Stat;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A horizontal bar chart (values ×100) with interval whiskers, as SVG.
pub fn bars(title: &str, rows: &[(String, Stat)]) -> String {
    let (w, left, row_h, top) = (640.0, 130.0, 28.0, 40.0);
    let h = top + row_h * rows.len().max(1) as f64 + 30.0;
    let lo = rows
        .iter()
        .map(|(_, s)| s.lo.min(0.0))
        .fold(0.0f64, f64::min)
        * 100.0;
    let hi = rows
        .iter()
        .map(|(_, s)| s.hi.max(0.0))
        .fold(0.0f64, f64::max)
        * 100.0;
    let (lo, hi) = (
        lo.floor(),
        if hi - lo < 1e-9 { lo + 1.0 } else { hi.ceil() },
    );
    let span = w - left - 30.0;
    let x = |v: f64| left + (v - lo) / (hi - lo) * span;
    let mut o = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"22\" font-size=\"14\">{}</text>\n",
        esc(title)
    );
    o.push_str(&format!(
        "<line x1=\"{0:.1}\" y1=\"{1}\" x2=\"{0:.1}\" y2=\"{2}\" stroke=\"#444\"/>\n",
        x(0.0),
        top - 5.0,
        h - 25.0
    ));
    for (i, (name, s)) in rows.iter().enumerate() {
        let y = top + row_h * i as f64;
        let (a, b) = (x(0.0).min(x(100.0 * s.mean)), x(0.0).max(x(100.0 * s.mean)));
        o.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n<rect x=\"{a:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#4c78a8\"/>\n<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"black\"/>\n<text x=\"{:.1}\" y=\"{:.1}\">{:.1}</text>\n",
            left - 8.0,
            y + 15.0,
            esc(name),
            y + 4.0,
            (b - a).max(0.5),
            row_h - 10.0,
            x(100.0 * s.lo),
            y + 11.0,
            x(100.0 * s.hi),
            y + 11.0,
            x(100.0 * s.hi) + 4.0,
            y + 15.0,
            100.0 * s.mean
        ));
    }
    o.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\">{lo:.0}</text>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{hi:.0}</text>\n</svg>\n",
        left,
        h - 8.0,
        left + span,
        h - 8.0
    ));
    o
}
