//! A hand-written SVG plot of the latency distribution (CDF), so results need no plotting tool.

use std::{fmt::Write as _, time::Duration};

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 400.0;
const MARGIN: f64 = 60.0;
const TICKS: u32 = 5;

/// The cumulative distribution of `samples` as an SVG document titled `title`: latency in ms
/// across, the fraction of (change, agent) pairs applied by then up.
#[must_use]
pub fn cdf(title: &str, samples: &[Duration]) -> String {
    let mut sorted: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    sorted.sort_by(f64::total_cmp);
    let max = sorted.last().copied().unwrap_or(1.0).max(1.0);
    let (plot_w, plot_h) = (WIDTH - 2.0 * MARGIN, HEIGHT - 2.0 * MARGIN);
    let x = |ms: f64| MARGIN + ms / max * plot_w;
    let y = |fraction: f64| HEIGHT - MARGIN - fraction * plot_h;
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" text-anchor="middle" font-size="14">{}</text>
<line x1="{MARGIN}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{MARGIN}" y1="{MARGIN}" x2="{MARGIN}" y2="{}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">latency (ms)</text>
<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">fraction applied</text>
"#,
        WIDTH / 2.0,
        escape(title),
        y(0.0),
        WIDTH - MARGIN,
        y(0.0),
        y(0.0),
        WIDTH / 2.0,
        HEIGHT - 16.0,
        HEIGHT / 2.0,
        HEIGHT / 2.0,
    );
    for tick in 0..=TICKS {
        let fraction = f64::from(tick) / f64::from(TICKS);
        // Writing to a String cannot fail.
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{:.0}</text>
<text x="{:.1}" y="{:.1}" text-anchor="end">{fraction:.1}</text>"#,
            x(fraction * max),
            y(0.0) + 16.0,
            fraction * max,
            MARGIN - 6.0,
            y(fraction) + 4.0,
        );
    }
    let count = sorted.len();
    let mut points: Vec<(f64, f64)> = Vec::new();
    for (i, &ms) in sorted.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)] // sample counts are far below 2^52
        let point = (x(ms).round(), y((i + 1) as f64 / count as f64));
        // One point per pixel column, the highest: tens of thousands of samples stay a small file.
        match points.last_mut() {
            Some(last) if last.0 == point.0 => *last = point,
            _ => points.push(point),
        }
    }
    let points: Vec<String> = points
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    let _ = writeln!(
        svg,
        r#"<polyline fill="none" stroke="steelblue" stroke-width="2" points="{}"/>
</svg>"#,
        points.join(" ")
    );
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
}
