//! The loss curve of a training run as an SVG: the training loss per step (light) with its
//! running mean over a window (dark), and the validation loss (dots) where it was measured.

/// One validation measurement: (steps done, loss).
pub type Point = (usize, f32);

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The SVG of a run: `train` per step, `validation` at its steps, titled `title`.
pub fn svg(title: &str, train: &[f32], validation: &[Point]) -> String {
    let (w, h, left, right, top, bottom) = (720.0, 360.0, 56.0, 16.0, 32.0, 40.0);
    let steps = train
        .len()
        .max(validation.iter().map(|p| p.0).max().unwrap_or(0))
        .max(1);
    let all = train.iter().chain(validation.iter().map(|p| &p.1)).copied();
    let (lo, hi) = all.fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo.min(0.0), hi)
    } else {
        (0.0, 1.0)
    };
    let x = |s: f64| left + (w - left - right) * s / steps as f64;
    let y = |v: f32| top + (h - top - bottom) * f64::from((hi - v) / (hi - lo));
    let line = |pts: &[(f64, f32)], style: &str| {
        let d: Vec<String> = pts
            .iter()
            .map(|&(s, v)| format!("{:.1},{:.1}", x(s), y(v)))
            .collect();
        format!(
            "<polyline fill=\"none\" {style} points=\"{}\"/>\n",
            d.join(" ")
        )
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"20\" font-size=\"14\">{}</text>\n",
        esc(title)
    );
    for k in 0..=4 {
        let v = lo + (hi - lo) * k as f32 / 4.0;
        s.push_str(&format!(
            "<line x1=\"{left}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"4\" y=\"{:.1}\">{v:.2}</text>\n",
            w - right,
            y(v),
            y(v),
            y(v) + 4.0
        ));
    }
    s.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\">step (of {steps})</text>\n",
        w / 2.0 - 40.0,
        h - 8.0
    ));
    let raw: Vec<(f64, f32)> = train
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as f64 + 1.0, v))
        .collect();
    s.push_str(&line(&raw, "stroke=\"#9ecae1\" stroke-width=\"1\""));
    let win = (train.len() / 20).max(1);
    let mean: Vec<(f64, f32)> = (0..train.len())
        .map(|i| {
            let a = (i + 1).saturating_sub(win);
            let m = train[a..=i].iter().sum::<f32>() / (i + 1 - a) as f32;
            (i as f64 + 1.0, m)
        })
        .collect();
    s.push_str(&line(&mean, "stroke=\"#08519c\" stroke-width=\"2\""));
    for &(st, v) in validation {
        s.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"#d94801\"/><text x=\"{:.1}\" y=\"{:.1}\">{v:.3}</text>\n",
            x(st as f64),
            y(v),
            x(st as f64) + 6.0,
            y(v) - 6.0
        ));
    }
    s.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{top}\" fill=\"#08519c\">training loss (running mean of {win})</text>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#d94801\">validation loss</text>\n</svg>\n",
        w - 300.0,
        w - 300.0,
        top + 16.0
    ));
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_curve_has_every_step_and_every_validation_point() {
        let s = super::svg("a <b>", &[3.0, 2.5, 2.0, 1.5], &[(0, 3.1), (4, 1.9)]);
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert!(s.contains("a &lt;b&gt;"));
        assert_eq!(s.matches("<circle").count(), 2);
        assert!(s.contains("1.900"));
        let pts = s.split("<polyline").nth(1).unwrap();
        assert_eq!(
            pts.split("points=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .split(' ')
                .count(),
            4
        );
    }
}
