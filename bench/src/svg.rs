//! Hand-written SVG plots, so results need no plotting tool: B1's latency distribution (CDF),
//! B2's grouped bars and B3's measures against cluster size (lines), all on one kind of frame.

use std::{fmt::Write as _, time::Duration};

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 400.0;
const MARGIN: f64 = 60.0;
const TICKS: u32 = 5;
/// Line colours, one per series, in order.
const COLOURS: [&str; 6] = [
    "steelblue",
    "darkorange",
    "seagreen",
    "firebrick",
    "dimgray",
    "mediumpurple",
];

/// The start of a plot: background, title, both axes and their labels.
fn frame(title: &str, x_label: &str, y_label: &str) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" text-anchor="middle" font-size="14">{}</text>
<line x1="{MARGIN}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{MARGIN}" y1="{MARGIN}" x2="{MARGIN}" y2="{}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>
"#,
        WIDTH / 2.0,
        escape(title),
        HEIGHT - MARGIN,
        WIDTH - MARGIN,
        HEIGHT - MARGIN,
        HEIGHT - MARGIN,
        WIDTH / 2.0,
        HEIGHT - 16.0,
        escape(x_label),
        HEIGHT / 2.0,
        HEIGHT / 2.0,
        escape(y_label),
    )
}

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
        let y0 = self.y(0.0);
        let mut svg = frame(self.title, self.x_label, self.y_label);
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

/// A tick's text: one decimal on axes up to 10 (fractions, logarithms), else whole numbers, in
/// thousands (k) or millions (M) when large.
fn tick_label(value: f64, max: f64) -> String {
    if max <= 10.0 {
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

/// One group of bars (say, one cluster size): its label and a value per series, `None` where
/// one was not measured.
#[derive(Debug, Clone)]
pub struct Group {
    /// Written under the group.
    pub label: String,
    /// One per series, in the order of the legend.
    pub values: Vec<Option<f64>>,
}

/// Grouped bars on a logarithmic axis (values of different magnitudes side by side), each bar
/// labelled with its value; `series` names the bars of every group, in the legend.
#[must_use]
pub fn grouped_bars(title: &str, y_label: &str, series: &[&str], groups: &[Group]) -> String {
    let values = groups.iter().flat_map(|g| g.values.iter().flatten());
    let positive: Vec<f64> = values.copied().filter(|v| *v > 0.0).collect();
    let low = positive.iter().copied().fold(f64::INFINITY, f64::min);
    let high = positive.iter().copied().fold(0.0, f64::max);
    let (low, high) = if positive.is_empty() {
        (0.0, 1.0)
    } else {
        // Half the smallest value still shows a bar for it, even when it is a power of ten.
        let low = (low / 2.0).log10().floor();
        (low, high.log10().ceil().max(low + 1.0))
    };
    let plot_h = HEIGHT - 2.0 * MARGIN;
    let y = |value: f64| HEIGHT - MARGIN - (value.log10() - low) / (high - low) * plot_h;
    let mut svg = frame(title, "", y_label);
    let mut decade = low;
    while decade <= high {
        let value = 10f64.powf(decade);
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{value}</text>
<line x1="{MARGIN}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="lightgrey"/>"#,
            MARGIN - 6.0,
            y(value) + 4.0,
            y(value),
            WIDTH - MARGIN,
            y(value),
        );
        decade += 1.0;
    }
    #[allow(clippy::cast_precision_loss)] // a handful of groups and series
    let (group_w, bars) = (
        (WIDTH - 2.0 * MARGIN) / groups.len().max(1) as f64,
        series.len().max(1) as f64,
    );
    let bar_w = group_w * 0.8 / bars;
    for (g, group) in groups.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let left = MARGIN + g as f64 * group_w + group_w * 0.1;
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            left + group_w * 0.4,
            HEIGHT - MARGIN + 16.0,
            escape(&group.label),
        );
        for (s, value) in group.values.iter().enumerate() {
            let Some(value) = value.filter(|v| *v > 0.0) else {
                continue;
            };
            #[allow(clippy::cast_precision_loss)]
            let x = left + s as f64 * bar_w;
            let top = y(value.max(10f64.powf(low)));
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
                bar_w - 2.0,
                HEIGHT - MARGIN - top,
                COLOURS[s % COLOURS.len()],
                x + bar_w / 2.0,
                top - 3.0,
                short(value),
            );
        }
    }
    for (s, name) in series.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let x = MARGIN + 10.0 + s as f64 * 140.0;
        let _ = writeln!(
            svg,
            r#"<rect x="{x:.1}" y="36" width="12" height="12" fill="{}"/>
<text x="{:.1}" y="46">{}</text>"#,
            COLOURS[s % COLOURS.len()],
            x + 16.0,
            escape(name),
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// A value with about three significant digits.
fn short(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
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

    #[test]
    fn bars_reach_their_value_on_the_log_axis() {
        let groups = [Group {
            label: "1k".to_owned(),
            values: vec![Some(10.0), None, Some(1000.0)],
        }];
        let svg = grouped_bars("B2", "ms", &["a", "b", "c"], &groups);
        assert!(svg.trim_end().ends_with("</svg>"));
        // Decades 1 to 1000 span the plot from y = 340 up to 60; 10 is a third of the way up.
        assert!(svg.contains(r#"y="246.7" width"#), "{svg}");
        assert!(svg.contains(r#"y="60.0" width"#), "{svg}");
        // The missing value has no bar: two bars plus three legend boxes.
        assert_eq!(svg.matches("<rect x=").count(), 5, "{svg}");
    }
}
