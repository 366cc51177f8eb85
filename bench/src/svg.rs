//! Hand-written SVG plots, so results need no plotting tool: B1's latency distribution (CDF) and
//! B3's measures against cluster size (lines), both drawn on one kind of frame.

use std::{fmt::Write as _, time::Duration};

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 400.0;
const MARGIN: f64 = 60.0;
const TICKS: u32 = 5;
/// Line colours, one per series, in order.
const COLOURS: [&str; 4] = ["steelblue", "darkorange", "seagreen", "firebrick"];

/// A plot's axes: labels and the largest value on each (both start at zero).
struct Frame<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    x_max: f64,
    y_max: f64,
}

impl Frame<'_> {
    fn x(&self, value: f64) -> f64 {
        MARGIN + value / self.x_max * (WIDTH - 2.0 * MARGIN)
    }

    fn y(&self, value: f64) -> f64 {
        HEIGHT - MARGIN - value / self.y_max * (HEIGHT - 2.0 * MARGIN)
    }

    /// The opening of the SVG document: background, title, axes, their labels and ticks.
    fn open(&self) -> String {
        let (x0, y0) = (self.x(0.0), self.y(0.0));
        let mut svg = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" text-anchor="middle" font-size="14">{}</text>
<line x1="{x0}" y1="{y0}" x2="{}" y2="{y0}" stroke="black"/>
<line x1="{x0}" y1="{MARGIN}" x2="{x0}" y2="{y0}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>
"#,
            WIDTH / 2.0,
            escape(self.title),
            WIDTH - MARGIN,
            WIDTH / 2.0,
            HEIGHT - 16.0,
            escape(self.x_label),
            HEIGHT / 2.0,
            HEIGHT / 2.0,
            escape(self.y_label),
        );
        for tick in 0..=TICKS {
            let fraction = f64::from(tick) / f64::from(TICKS);
            let (x, y) = (fraction * self.x_max, fraction * self.y_max);
            // Writing to a String cannot fail.
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>
<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                self.x(x),
                y0 + 16.0,
                tick_label(x, self.x_max),
                MARGIN - 6.0,
                self.y(y) + 4.0,
                tick_label(y, self.y_max),
            );
        }
        svg
    }
}

/// A tick's text: one decimal on axes up to 1 (fractions), else whole numbers, in thousands
/// (k) or millions (M) when large.
fn tick_label(value: f64, max: f64) -> String {
    if max <= 1.0 {
        format!("{value:.1}")
    } else if max >= 1e7 {
        format!("{:.0}M", value / 1e6)
    } else if max >= 1e4 {
        format!("{:.0}k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

/// A polyline through `points` (already in pixels).
fn polyline(points: &[(f64, f64)], colour: &str) -> String {
    let points: Vec<String> = points
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    format!(
        r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
        points.join(" ")
    )
}

/// The cumulative distribution of `samples` as an SVG document titled `title`: latency in ms
/// across, the fraction of (change, agent) pairs applied by then up.
#[must_use]
pub fn cdf(title: &str, samples: &[Duration]) -> String {
    let mut sorted: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    sorted.sort_by(f64::total_cmp);
    let frame = Frame {
        title,
        x_label: "latency (ms)",
        y_label: "fraction applied",
        x_max: sorted.last().copied().unwrap_or(1.0).max(1.0),
        y_max: 1.0,
    };
    let mut svg = frame.open();
    let count = sorted.len();
    let mut points: Vec<(f64, f64)> = Vec::new();
    for (i, &ms) in sorted.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)] // sample counts are far below 2^52
        let point = (frame.x(ms).round(), frame.y((i + 1) as f64 / count as f64));
        // One point per pixel column, the highest: tens of thousands of samples stay a small file.
        match points.last_mut() {
            Some(last) if last.0 == point.0 => *last = point,
            _ => points.push(point),
        }
    }
    let _ = writeln!(svg, "{}\n</svg>", polyline(&points, COLOURS[0]));
    svg
}

/// One line of a [`lines`] plot: its legend and its (x, y) points.
pub struct Series {
    /// The legend text.
    pub name: String,
    /// The points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// `series` as lines with dots and a legend, in an SVG document titled `title`.
#[must_use]
pub fn lines(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (x_max, y_max) = all.fold((0.0_f64, 0.0_f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let frame = Frame {
        title,
        x_label,
        y_label,
        x_max: x_max.max(1.0),
        // Head room above the highest point, so the legend does not cover it.
        y_max: (y_max * 1.25).max(1.0),
    };
    let mut svg = frame.open();
    for (i, (line, colour)) in series.iter().zip(COLOURS.iter().cycle()).enumerate() {
        let points: Vec<(f64, f64)> = line
            .points
            .iter()
            .map(|&(x, y)| (frame.x(x), frame.y(y)))
            .collect();
        let _ = writeln!(svg, "{}", polyline(&points, colour));
        for (x, y) in &points {
            let _ = writeln!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{colour}"/>"#
            );
        }
        #[allow(clippy::cast_precision_loss)] // a handful of series
        let legend_y = MARGIN + 16.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{legend_y:.1}" fill="{colour}">{}</text>"#,
            MARGIN + 10.0,
            escape(&line.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// SVG documents (of the same height) side by side in one.
#[must_use]
pub fn side_by_side(plots: &[String]) -> String {
    #[allow(clippy::cast_precision_loss)] // a handful of plots
    let width = WIDTH * plots.len() as f64;
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{HEIGHT}">
"#
    );
    for (i, plot) in plots.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let x = WIDTH * i as f64;
        let _ = writeln!(svg, r#"<g transform="translate({x} 0)">{plot}</g>"#);
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curve_ends_at_the_largest_sample_and_every_pair() {
        let samples = [300, 100, 200].map(Duration::from_millis);
        let svg = cdf("B1 <test>", &samples);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("B1 &lt;test&gt;"));
        // 300 ms is the right end of the plot (x = 580) at fraction 1 (y = 60).
        assert!(svg.contains(" 580.0,60.0\""), "{svg}");
    }

    #[test]
    fn lines_put_the_largest_point_below_the_top_and_name_every_series() {
        let series = [
            Series {
                name: "upstream".to_owned(),
                points: vec![(10.0, 20.0), (20.0, 40.0)],
            },
            Series {
                name: "splitproxy".to_owned(),
                points: vec![(10.0, 2.0), (20.0, 2.0)],
            },
        ];
        let svg = lines("B3", "nodes", "watches", &series);
        assert!(svg.contains(">upstream<") && svg.contains(">splitproxy<"));
        // x 20 is the right end (580); y 40 sits at 40 / 50 of the height (280 px): 340 - 224.
        assert!(svg.contains(r#"cx="580.0" cy="116.0""#), "{svg}");
        let both = side_by_side(&[svg.clone(), svg]);
        assert!(both.contains(r#"width="1280""#) && both.contains("translate(640 0)"));
    }
}
