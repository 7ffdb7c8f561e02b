//! The chart beside `BENCHMARKS.md`: B7's throughput against concurrency,
//! and B1's ratios to plain calls.

use std::path::Path;

use super::Report;

/// The chart beside `BENCHMARKS.md`.
pub const CHART: &str = "benchmarks.svg";

/// B7's calls per second against tasks (plain, reference, idem), and
/// B1's ratios to plain calls (idem, reference), as SVG at `path`.
pub fn chart(report: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    const REFERENCE: RGBColor = RGBColor(0, 140, 0);
    let root = SVGBackend::new(path, (900, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(420);
    if !report.b7.is_empty() {
        let calls: Vec<f64> = report
            .b7
            .iter()
            .flat_map(|&(_, plain, reference, idem)| [Some(plain), reference, Some(idem)])
            .flatten()
            .collect();
        let (lowest, highest) = (
            calls.iter().copied().fold(f64::MAX, f64::min),
            calls.iter().copied().fold(0.0, f64::max),
        );
        let tasks: Vec<f64> = report.b7.iter().map(|p| p.0 as f64).collect();
        let mut chart = panel(&top, "B7, PostgreSQL: record mode, bare INSERT")
            .build_cartesian_2d(
                (0.8f64..80.0).log_scale().with_key_points(tasks),
                (lowest * 0.7..highest * 1.5).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc("tasks (and connections, and pgbench clients)")
            .y_desc("calls per second (log scale)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        let curves = [
            (
                "plain (no attribute)",
                BLUE,
                report
                    .b7
                    .iter()
                    .map(|p| Some((p.0 as f64, p.1)))
                    .collect::<Vec<_>>(),
            ),
            (
                "reference (pgbench)",
                REFERENCE,
                report
                    .b7
                    .iter()
                    .map(|p| p.2.map(|r| (p.0 as f64, r)))
                    .collect(),
            ),
            (
                "idem, record mode",
                RED,
                report.b7.iter().map(|p| Some((p.0 as f64, p.3))).collect(),
            ),
        ];
        for (name, color, points) in curves {
            let points: Vec<(f64, f64)> = points.into_iter().flatten().collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()?;
    }
    if !report.b1.is_empty() {
        let labels: Vec<&str> = report
            .b1
            .iter()
            .map(|(label, _, _)| label.as_str())
            .collect();
        let highest = report
            .b1
            .iter()
            .flat_map(|&(_, idem, reference)| [idem, reference.unwrap_or(0.0)])
            .fold(0.0, f64::max);
        let mut chart = panel(
            &bottom,
            "B1, first execution, bare write (INSERT, Redis INCRBY): throughput / plain calls",
        )
        // Integer ranges are inclusive: one segment per label.
        .build_cartesian_2d(
            (0..labels.len() - 1).into_segmented(),
            0f64..(highest * 1.2).max(0.1),
        )?;
        chart
            .configure_mesh()
            .x_labels(labels.len())
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels.get(*i).copied().unwrap_or_default().to_owned(),
                _ => String::new(),
            })
            .y_desc("ratio to plain calls")
            .draw()?;
        let at = |i: usize, ratio: f64| (SegmentValue::CenterOf(i), ratio);
        chart
            .draw_series(
                report
                    .b1
                    .iter()
                    .enumerate()
                    .map(|(i, p)| Circle::new(at(i, p.1), 6, RED.filled())),
            )?
            .label("idem")
            .legend(|(x, y)| Circle::new((x + 10, y), 6, RED.filled()));
        chart
            .draw_series(report.b1.iter().enumerate().filter_map(|(i, p)| {
                p.2.map(|r| Cross::new(at(i, r), 7, REFERENCE.stroke_width(3)))
            }))?
            .label("reference")
            .legend(|(x, y)| Cross::new((x + 10, y), 7, REFERENCE.stroke_width(3)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// One of the chart's panels, with its caption.
fn panel<'a, 'b, DB: plotters::prelude::DrawingBackend>(
    area: &'a plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
) -> plotters::prelude::ChartBuilder<'a, 'b, DB> {
    let mut builder = plotters::prelude::ChartBuilder::on(area);
    builder
        .caption(caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70);
    builder
}
