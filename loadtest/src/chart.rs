//! The run's time series as one self-contained SVG, drawn with `plotters` (its SVG backend
//! only): operations completed per second by outcome (ok / out of stock / error) above, p50 and
//! p99 latency per second below, on a shared time axis. Pure (no I/O): the caller writes it
//! beside the JSON report.
//!
//! The output has no scripts, stylesheets or fonts to fetch; it renders the same on GitHub, in a
//! browser and in an image viewer. Each series is drawn in its own colour ([`SERIES_COLOURS`]):
//! one polyline per run of consecutive seconds that have a value (latency series break where a
//! second had no operation) and, when there are few points, a marker per point; the legend is
//! drawn with filled boxes, so the polylines of a colour are exactly its series and the file is
//! also easy to check by machine.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::Report;
use crate::timeline::SecondReport;

const WIDTH: u32 = 960;
const HEIGHT: u32 = 640;
/// Room right of each plot for its legend.
const LEGEND_WIDTH: u32 = 170;
/// Markers on every point up to this many points per series; beyond, lines alone stay legible.
const MARKERS_MAX: usize = 120;

/// Every series' name and colour (`#RRGGBB`, as the SVG writes it), counts first.
pub const SERIES_COLOURS: [(&str, &str); 5] = [
    ("ok", "#2E7D32"),
    ("out_of_stock", "#EF6C00"),
    ("error", "#C62828"),
    ("p50", "#1565C0"),
    ("p99", "#6A1B9A"),
];

/// A series: its legend text, colour and value per second.
struct Series<'a> {
    label: &'static str,
    colour: RGBColor,
    value: &'a dyn Fn(&SecondReport) -> Option<f64>,
}

/// A step of 1, 2 or 5 times a power of ten giving at most about `ticks` intervals up to `max`,
/// and the axis top (a multiple of the step, at least one step).
pub fn nice_axis(max: f64, ticks: usize) -> (f64, f64) {
    if !(max.is_finite() && max > 0.0) {
        return (1.0, 1.0);
    }
    let raw = max / ticks.max(1) as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * magnitude);
    let top = ((max / step) * (1.0 - 1e-9)).ceil().max(1.0) * step;
    (step, top)
}

/// A tick label with no more decimals than the step needs.
fn tick_label(value: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10()).ceil() as usize
    };
    format!("{value:.decimals$}")
}

fn rgb(hex: &str) -> RGBColor {
    let byte = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16).unwrap_or(0);
    RGBColor(byte(1), byte(3), byte(5))
}

fn colour_of(name: &str) -> RGBColor {
    SERIES_COLOURS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(BLACK, |(_, hex)| rgb(hex))
}

fn max_of(seconds: &[SecondReport], series: &[Series]) -> f64 {
    seconds
        .iter()
        .flat_map(|sec| series.iter().filter_map(|s| (s.value)(sec)))
        .fold(0.0, f64::max)
}

type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// What one panel shows.
struct PanelSpec<'a> {
    title: &'a str,
    y_label: &'a str,
    x_max: f64,
    x_step: f64,
    series: &'a [Series<'a>],
}

/// One panel: axes with ticks at `nice_axis` steps, a polyline per run of seconds with a value,
/// and a legend to the right.
fn panel(area: &DrawingArea<SVGBackend, Shift>, seconds: &[SecondReport], p: &PanelSpec) -> Drawn {
    let (y_step, y_max) = nice_axis(max_of(seconds, p.series), 5);
    let (plot, legend) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            p.title,
            ("sans-serif", 18).into_font().style(FontStyle::Bold),
        )
        .margin(8)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..p.x_max, 0f64..y_max)?;
    let x_ticks = (p.x_max / p.x_step).floor() as usize + 1;
    let y_ticks = (y_max / y_step).round() as usize + 1;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(224, 224, 224))
        .x_labels(x_ticks)
        .y_labels(y_ticks)
        .x_label_formatter(&|v| tick_label(*v, p.x_step))
        .y_label_formatter(&|v| tick_label(*v, y_step))
        .x_desc("seconds since start")
        .y_desc(p.y_label)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .draw()?;
    for (row, s) in p.series.iter().enumerate() {
        // A point sits in the middle of the time its second covers (the last one is short).
        let points: Vec<Option<(f64, f64)>> = seconds
            .iter()
            .map(|sec| (s.value)(sec).map(|v| (sec.second as f64 + sec.span_secs / 2.0, v)))
            .collect();
        let markers = points.iter().flatten().count() <= MARKERS_MAX;
        for run in points.split(Option::is_none).filter(|r| !r.is_empty()) {
            let line = LineSeries::new(run.iter().flatten().copied(), s.colour.stroke_width(2));
            chart.draw_series(line.point_size(if markers { 3 } else { 0 }))?;
        }
        let y = 48 + 26 * row as i32;
        legend.draw(&Rectangle::new(
            [(12, y - 5), (36, y + 5)],
            s.colour.filled(),
        ))?;
        legend.draw(&Text::new(s.label, (44, y - 8), ("sans-serif", 15)))?;
    }
    Ok(())
}

/// The report's timeline as an SVG document.
pub fn render_svg(report: &Report) -> anyhow::Result<String> {
    let mut out = String::new();
    draw(report, &mut out).map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    Ok(out)
}

fn draw(report: &Report, out: &mut String) -> Drawn {
    let seconds = &report.timeline.seconds;
    let c = &report.config;
    // The time axis ends with the run (ticks at round seconds within it), not at the next
    // round number: a 20.6 s run should not leave a fifth of the chart empty.
    let x_max = seconds
        .last()
        .map_or(1.0, |s| s.second as f64 + s.span_secs)
        .max(1.0);
    let (x_step, _) = nice_axis(x_max, 10);
    let counts: [Series; 3] = [
        Series {
            label: "ok",
            colour: colour_of("ok"),
            value: &|s| Some(s.ok as f64),
        },
        Series {
            label: "out of stock",
            colour: colour_of("out_of_stock"),
            value: &|s| Some(s.out_of_stock as f64),
        },
        Series {
            label: "error",
            colour: colour_of("error"),
            value: &|s| Some(s.error as f64),
        },
    ];
    let latencies: [Series; 2] = [
        Series {
            label: "p50",
            colour: colour_of("p50"),
            value: &|s| s.p50_ms,
        },
        Series {
            label: "p99",
            colour: colour_of("p99"),
            value: &|s| s.p99_ms,
        },
    ];
    let mode = match c.rate {
        Some(rate) => format!("open loop at {rate}/s, at most {} in flight", c.concurrency),
        None => format!("closed loop, {} workers", c.concurrency),
    };
    let title = format!("loadtest run {}: {mode}", c.run_id);
    let subtitle = format!(
        "{} · skew {} over {} SKUs · {} operations in {:.1} s · p50 {:.2} ms · p99 {:.2} ms · invariants {}",
        c.target,
        c.skew,
        c.skus,
        report.latency.count,
        report.elapsed_secs,
        report.latency.p50_ms,
        report.latency.p99_ms,
        if report.invariants.ok { "OK" } else { "FAILED" }
    );

    let root = SVGBackend::with_string(out, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    root.draw(&Text::new(
        title,
        (16, 10),
        ("sans-serif", 21).into_font().style(FontStyle::Bold),
    ))?;
    root.draw(&Text::new(
        subtitle,
        (16, 38),
        ("sans-serif", 15).into_font().color(&RGBColor(85, 85, 85)),
    ))?;
    let body = root.margin(62, 0, 0, 0);
    let (upper, lower) = body.split_vertically((HEIGHT - 62) / 2);
    let spec = |title, y_label, series| PanelSpec {
        title,
        y_label,
        x_max,
        x_step,
        series,
    };
    panel(
        &upper,
        seconds,
        &spec(
            "throughput: operations completed per second",
            "operations / s",
            &counts,
        ),
    )?;
    panel(
        &lower,
        seconds,
        &spec(
            "latency of the operations completed in each second",
            "latency (ms)",
            &latencies,
        ),
    )?;
    root.present()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::InvariantReport;
    use crate::report::RunConfig;
    use crate::stats::WorkerStats;
    use crate::timeline::TimelineReport;

    fn second(s: u64, span: f64, counts: [u64; 3], p: Option<(f64, f64)>) -> SecondReport {
        SecondReport {
            second: s,
            span_secs: span,
            ok: counts[0],
            out_of_stock: counts[1],
            error: counts[2],
            p50_ms: p.map(|p| p.0),
            p99_ms: p.map(|p| p.1),
            max_ms: p.map(|p| p.1 * 2.0),
        }
    }

    fn report(seconds: Vec<SecondReport>) -> Report {
        let config = RunConfig {
            target: "http://127.0.0.1:8080".into(),
            run_id: "r<&>".into(),
            skew: "zipf:1.1".into(),
            concurrency: 4,
            duration_secs: Some(4.0),
            ..RunConfig::example()
        };
        let timeline = TimelineReport {
            interval_secs: 1.0,
            late_records: 0,
            seconds,
        };
        Report::build(
            config,
            3.5,
            &WorkerStats::default(),
            InvariantReport::default(),
            timeline,
        )
    }

    /// (x, y) pairs of every polyline of one series (the polylines of its colour).
    fn points(doc: &roxmltree::Document, series: &str) -> Vec<Vec<(f64, f64)>> {
        let colour = SERIES_COLOURS
            .iter()
            .find(|(n, _)| *n == series)
            .unwrap_or_else(|| panic!("no series {series}"))
            .1;
        doc.descendants()
            .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke") == Some(colour))
            .map(|line| {
                line.attribute("points")
                    .expect("points")
                    .split_whitespace()
                    .map(|xy| {
                        let (x, y) = xy.split_once(',').expect("x,y");
                        (x.parse().expect("x"), y.parse().expect("y"))
                    })
                    .collect()
            })
            .collect()
    }

    fn texts(doc: &roxmltree::Document) -> Vec<String> {
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .map(|t| t.trim().to_owned())
            .collect()
    }

    #[test]
    fn nice_axes() {
        assert_eq!(nice_axis(0.0, 5), (1.0, 1.0));
        assert_eq!(nice_axis(f64::NAN, 5), (1.0, 1.0));
        assert_eq!(nice_axis(10.0, 5), (2.0, 10.0));
        assert_eq!(nice_axis(11.0, 5), (5.0, 15.0));
        assert_eq!(nice_axis(3.5, 10), (0.5, 3.5));
        assert_eq!(nice_axis(973.0, 5), (200.0, 1000.0));
        let (step, top) = nice_axis(0.042, 5);
        assert!((step - 0.01).abs() < 1e-12 && (top - 0.05).abs() < 1e-12);
        assert_eq!(tick_label(0.5, 0.5), "0.5");
        assert_eq!(tick_label(400.0, 200.0), "400");
        assert_eq!(tick_label(0.03, 0.01), "0.03");
    }

    #[test]
    fn svg_has_every_series_with_one_point_per_second() {
        let r = report(vec![
            second(0, 1.0, [90, 5, 0], Some((2.0, 9.0))),
            second(1, 1.0, [100, 0, 1], Some((2.5, 12.0))),
            // An idle second: counts are 0, latency has no point (the line breaks).
            second(2, 1.0, [0, 0, 0], None),
            second(3, 0.5, [40, 2, 0], Some((3.0, 20.0))),
        ]);
        let svg = render_svg(&r).unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(
            root.tag_name().namespace(),
            Some("http://www.w3.org/2000/svg")
        );
        // Self-contained: nothing to load or run.
        assert!(!svg.contains("<script") && !svg.contains("href"), "{svg}");
        // Besides the series only the black axes and ticks are polylines.
        let colours: Vec<&str> = SERIES_COLOURS.iter().map(|(_, c)| *c).collect();
        let strays = doc
            .descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .filter_map(|n| n.attribute("stroke"))
            .filter(|c| !colours.contains(c) && *c != "#000000")
            .count();
        assert_eq!(strays, 0, "{svg}");

        for name in ["ok", "out_of_stock", "error"] {
            let lines = points(&doc, name);
            assert_eq!(lines.len(), 1, "{name}");
            assert_eq!(lines[0].len(), 4, "{name}: one point per second");
        }
        for name in ["p50", "p99"] {
            let lines = points(&doc, name);
            assert_eq!(
                lines.iter().map(Vec::len).collect::<Vec<_>>(),
                [2, 1],
                "{name}: broken at the idle second"
            );
        }
        // Geometry: x grows with time in proportion, each point in the middle of its second
        // (0.5, 1.5, 2.5 and 3.25 s); the busiest second is the highest ok point.
        let ok = &points(&doc, "ok")[0];
        assert!(ok.windows(2).all(|w| w[0].0 < w[1].0), "{ok:?}");
        let second_width = ok[1].0 - ok[0].0;
        assert!(second_width > 50.0, "{ok:?}");
        let at = |t: f64| ok[0].0 + second_width * (t - 0.5);
        assert!((ok[2].0 - at(2.5)).abs() <= 2.0 && (ok[3].0 - at(3.25)).abs() <= 2.0);
        let top = ok.iter().map(|p| p.1).fold(f64::MAX, f64::min);
        assert_eq!(top, ok[1].1);
        // The latency panel is below the throughput panel.
        let p99 = points(&doc, "p99").concat();
        let lowest_ok = ok.iter().map(|p| p.1).fold(f64::MIN, f64::max);
        assert!(p99.iter().all(|(_, y)| *y > lowest_ok), "{p99:?}");
        // ... and on the same time axis.
        assert!((p99[0].0 - ok[0].0).abs() <= 1.0);

        let texts = texts(&doc);
        for label in [
            "operations / s",
            "latency (ms)",
            "seconds since start",
            "ok",
            "out of stock",
            "error",
            "p50",
            "p99",
        ] {
            assert!(texts.iter().any(|t| t == label), "{label} in {texts:?}");
        }
        // Counts axis to 100 in steps of 20, latency to 20 ms; time ticks every half second.
        for tick in ["0", "20", "100", "5", "15", "0.5", "3.5"] {
            assert!(texts.iter().any(|t| t == tick), "tick {tick} in {texts:?}");
        }
        // The run id is escaped, not markup.
        assert!(texts.iter().any(|t| t.contains("r<&>")), "{texts:?}");
    }

    #[test]
    fn svg_of_an_empty_run_is_still_valid() {
        let svg = render_svg(&report(Vec::new())).unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
        assert!(points(&doc, "ok").is_empty());
        assert!(points(&doc, "p99").is_empty());
    }
}
