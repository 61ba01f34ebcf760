//! A small line-chart writer: SVG text, logarithmic axes (every plot spans decades), a legend. No dependencies, so the
//! benchmark writes its plots itself.

use std::fmt::Write;

pub struct Series {
    pub name: String,
    /// (x, y) points; non-positive values are skipped on logarithmic axes.
    pub points: Vec<(f64, f64)>,
    /// Dashed line (baselines and floors).
    pub dashed: bool,
    /// Index into the palette; `None`: by position.
    pub color: Option<usize>,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Logarithmic axis mapping of one dimension: decades `lo..hi` (log10).
struct Axis {
    lo: f64,
    hi: f64,
}

impl Axis {
    /// `tight`: the range of the data plus a margin (for x); otherwise whole decades (for y).
    fn new(values: impl Iterator<Item = f64>, tight: bool) -> Option<Axis> {
        let logs: Vec<f64> = values
            .filter(|v| v.is_finite() && *v > 0.0)
            .map(f64::log10)
            .collect();
        let lo = logs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if logs.is_empty() {
            return None;
        }
        Some(if tight {
            let margin = ((hi - lo) * 0.06).max(0.05);
            Axis {
                lo: lo - margin,
                hi: hi + margin,
            }
        } else {
            Axis {
                lo: lo.floor(),
                hi: hi.ceil().max(lo.floor() + 1.0),
            }
        })
    }

    /// Position in 0..=1, or `None` for values a log axis cannot show.
    fn frac(&self, v: f64) -> Option<f64> {
        (v > 0.0).then(|| (v.log10() - self.lo) / (self.hi - self.lo))
    }

    fn ticks(&self) -> Vec<f64> {
        (self.lo as i32..=self.hi as i32)
            .map(|e| 10f64.powi(e))
            .collect()
    }
}

fn tick_label(v: f64) -> String {
    if v >= 1e6 && v.log10().fract() == 0.0 {
        format!("1e{}", v.log10() as i32)
    } else if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

impl Chart {
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
            LEFT + (WIDTH - LEFT - RIGHT) / 2.0,
            escape(&self.title)
        );
        let all = || self.series.iter().flat_map(|s| s.points.iter());
        let (Some(xa), Some(ya)) = (
            Axis::new(all().map(|p| p.0), true),
            Axis::new(all().map(|p| p.1), false),
        ) else {
            let _ = writeln!(s, r#"<text x="40" y="80">no data</text></svg>"#);
            return s;
        };
        let (pw, ph) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
        let px = |v: f64| xa.frac(v).map(|f| LEFT + f * pw);
        let py = |v: f64| ya.frac(v).map(|f| TOP + ph - f * ph);
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
        );
        for t in ya.ticks() {
            if let Some(y) = py(t) {
                let _ = writeln!(
                    s,
                    r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                    LEFT + pw,
                    LEFT - 6.0,
                    y + 4.0,
                    tick_label(t)
                );
            }
        }
        let mut xs: Vec<f64> = all().map(|p| p.0).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        for t in xs {
            if let Some(x) = px(t) {
                let _ = writeln!(
                    s,
                    r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{}" stroke="#eee"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
                    TOP + ph,
                    TOP + ph + 16.0,
                    tick_label(t)
                );
            }
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            LEFT + pw / 2.0,
            HEIGHT - 18.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{}</text>"#,
            TOP + ph / 2.0,
            TOP + ph / 2.0,
            escape(&self.y_label)
        );
        for (i, series) in self.series.iter().enumerate() {
            let color = COLORS[series.color.unwrap_or(i) % COLORS.len()];
            let dash = if series.dashed {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            };
            let pts: Vec<String> = series
                .points
                .iter()
                .filter_map(|&(x, y)| Some(format!("{:.1},{:.1}", px(x)?, py(y)?)))
                .collect();
            if !pts.is_empty() {
                let _ = writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
                    pts.join(" ")
                );
                for p in &pts {
                    let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
                    let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="3" fill="{color}"/>"#);
                }
            }
            let ly = TOP + 10.0 + i as f64 * 20.0;
            let lx = WIDTH - RIGHT + 15.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
                lx + 24.0,
                lx + 30.0,
                ly + 4.0,
                escape(&series.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests;
