//! PNG charts with plotters: TTFT CDF per strategy and requests per endpoint per strategy.

use std::path::Path;

use plotters::prelude::*;

use crate::harness::StrategyRun;
use crate::report::percentile;

/// One colour per strategy of a full comparison (eleven), so no two lines of a chart share one: matplotlib's
/// "tab10" palette, then black and navy.
const COLORS: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(0, 0, 128),
];

/// `ttft_cdf.png`: fraction of requests with TTFT ≤ x (simulated ms), one line per strategy; x capped at the
/// second-largest p99 of three or more strategies (else the largest), so neither one slow request nor one strategy
/// with a tail far beyond the others' (on the chat demo, the SGLang-style baseline's seconds) flattens the rest: the
/// line of such a strategy ends at the right edge.
pub fn ttft_cdf(path: &Path, runs: &[StrategyRun]) -> anyhow::Result<()> {
    let series: Vec<(String, Vec<f64>)> = runs
        .iter()
        .map(|r| {
            let mut v: Vec<f64> = r.outcomes.iter().filter(|o| o.ok).map(|o| o.sim_ttft_ms(r.time_scale)).collect();
            v.sort_by(f64::total_cmp);
            (r.label.clone(), v)
        })
        .collect();
    let mut p99: Vec<f64> = series.iter().map(|(_, v)| percentile(&mut v.clone(), 0.99)).collect();
    p99.sort_by(|a, b| b.total_cmp(a));
    let cap = if p99.len() >= 3 { p99[1] } else { p99.first().copied().unwrap_or(1.0) };
    let xmax = cap.max(1.0) * 1.05;
    let root = BitMapBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("TTFT CDF per strategy", ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..xmax, 0.0..1.0)?;
    chart.configure_mesh().x_desc("time to first token, simulated ms").y_desc("fraction of requests").draw()?;
    for (i, (label, v)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let n = v.len().max(1) as f64;
        let pts = v.iter().enumerate().map(|(k, &x)| (x.min(xmax), (k + 1) as f64 / n));
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// `load_per_endpoint.png`: share of requests each endpoint served (server truth), grouped by strategy.
pub fn load_per_endpoint(path: &Path, runs: &[StrategyRun]) -> anyhow::Result<()> {
    let endpoints = runs.iter().map(|r| r.servers.len()).max().unwrap_or(1).max(1);
    let groups = runs.len().max(1);
    let ymax = runs
        .iter()
        .flat_map(|r| {
            let total: f64 = r.servers.iter().map(|(_, m)| m.requests).sum::<f64>().max(1.0);
            r.servers.iter().map(move |(_, m)| m.requests / total)
        })
        .fold(0.0_f64, f64::max)
        .max(1.0 / endpoints as f64)
        * 1.25;
    let root = BitMapBackend::new(path, (1120, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    // The key (colour → endpoint) beside the chart, where no bar or strategy name can hide it.
    let (plot_area, key_area) = root.split_horizontally(1000);
    let width = (groups * (endpoints + 1)) as f64;
    let mut chart = ChartBuilder::on(&plot_area)
        .caption("Share of requests per endpoint (bars) by strategy", ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..width, 0.0..ymax)?;
    let per = (endpoints + 1) as f64;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_desc("strategies (one bar per endpoint)")
        .y_desc("share of requests")
        .draw()?;
    for (g, r) in runs.iter().enumerate() {
        let total: f64 = r.servers.iter().map(|(_, m)| m.requests).sum::<f64>().max(1.0);
        for (e, (_, m)) in r.servers.iter().enumerate() {
            let x0 = g as f64 * per + e as f64 + 0.5;
            let color = COLORS[e % COLORS.len()];
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0, 0.0), (x0 + 0.9, m.requests / total)],
                color.filled(),
            )))?;
            // A mark on the axis under every bar, so an endpoint that got nothing shows as a gap, not as nothing.
            chart.draw_series(LineSeries::new([(x0, 0.0), (x0 + 0.9, 0.0)], color.stroke_width(4)))?;
        }
        // Strategy name above its group, on three staggered heights so long names of neighbouring groups do not
        // overlap.
        let y = ymax * [0.97, 0.92, 0.87][g % 3];
        chart.draw_series(std::iter::once(Text::new(
            r.label.clone(),
            (g as f64 * per + 0.5, y),
            ("sans-serif", 14),
        )))?;
    }
    let fair = 1.0 / endpoints as f64;
    chart.draw_series(LineSeries::new([(0.0, fair), (width, fair)], BLACK.stroke_width(1)))?;
    // The line, and which colour is which endpoint (the colours repeat past the palette's length).
    key_area.draw(&PathElement::new(vec![(5, 60), (25, 60)], BLACK))?;
    key_area.draw(&Text::new("fair share", (30, 53), ("sans-serif", 14)))?;
    for (e, color) in COLORS.iter().enumerate().take(endpoints) {
        let y = 82 + 22 * e as i32;
        key_area.draw(&Rectangle::new([(5, y - 6), (25, y + 6)], color.filled()))?;
        key_area.draw(&Text::new(format!("endpoint {}", e + 1), (30, y - 7), ("sans-serif", 14)))?;
    }
    root.present()?;
    Ok(())
}
