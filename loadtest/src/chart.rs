//! The run's time series as one self-contained SVG: operations completed per second by outcome
//! (ok / out of stock / error) above, p50 and p99 latency per second below, on a shared time
//! axis. Pure (no I/O): `main.rs` writes it beside the JSON report.
//!
//! Hand-written rather than drawn with a plotting crate: two panels of polylines need a few
//! dozen lines of SVG, and a plotting stack would add more to the build than this whole tool.
//! The output has no scripts, stylesheets or fonts to fetch; it renders the same on GitHub, in a
//! browser and in an image viewer.
//!
//! Each series is a `<g class="series" data-series="NAME">` holding its polylines (latency
//! series break where a second had no operation) and, when there are few points, a marker per
//! point, so the file is also easy to check by machine.

use std::fmt::Write as _;

use crate::report::Report;
use crate::timeline::SecondReport;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 640.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 180.0;
/// Top and height of the two plot areas.
const THROUGHPUT_TOP: f64 = 90.0;
const LATENCY_TOP: f64 = 370.0;
const PANEL_HEIGHT: f64 = 210.0;
/// Markers on every point up to this many points per series; beyond, lines alone stay legible.
const MARKERS_MAX: usize = 120;

/// A series: its name (also the `data-series` value), legend text, colour and value per second.
struct Series<'a> {
    name: &'static str,
    label: &'static str,
    colour: &'static str,
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

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// A plot area: maps (seconds, value) to SVG coordinates.
struct Panel {
    top: f64,
    x_max: f64,
    y_max: f64,
}

impl Panel {
    fn x(&self, t: f64) -> f64 {
        LEFT + (WIDTH - LEFT - RIGHT) * (t / self.x_max)
    }

    fn y(&self, v: f64) -> f64 {
        self.top + PANEL_HEIGHT * (1.0 - v / self.y_max)
    }
}

/// Axes, grid, tick labels and the y-axis title of one panel.
fn axes(out: &mut String, p: &Panel, x_step: f64, y_step: f64, title: &str, y_label: &str) {
    let (x0, x1) = (LEFT, WIDTH - RIGHT);
    let bottom = p.top + PANEL_HEIGHT;
    let _ = writeln!(
        out,
        r##"<text class="panel-title" x="{x0}" y="{:.1}" font-size="15" font-weight="bold">{}</text>"##,
        p.top - 12.0,
        escape(title)
    );
    let _ = writeln!(
        out,
        r##"<g class="grid" stroke="#e0e0e0" stroke-width="1">"##
    );
    let mut v = 0.0;
    while v <= p.y_max * (1.0 + 1e-9) {
        let y = p.y(v);
        let _ = writeln!(
            out,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}"/>"##
        );
        v += y_step;
    }
    let _ = writeln!(out, "</g>");
    let _ = writeln!(
        out,
        r##"<g class="y-ticks" font-size="11" text-anchor="end">"##
    );
    let mut v = 0.0;
    while v <= p.y_max * (1.0 + 1e-9) {
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}">{}</text>"##,
            x0 - 6.0,
            p.y(v) + 4.0,
            tick_label(v, y_step)
        );
        v += y_step;
    }
    let _ = writeln!(out, "</g>");
    let _ = writeln!(
        out,
        r##"<g class="x-ticks" font-size="11" text-anchor="middle">"##
    );
    let mut t = 0.0;
    while t <= p.x_max * (1.0 + 1e-9) {
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}">{}</text>"##,
            p.x(t),
            bottom + 16.0,
            tick_label(t, x_step)
        );
        t += x_step;
    }
    let _ = writeln!(out, "</g>");
    let _ = writeln!(
        out,
        r##"<path class="axis" d="M{x0},{:.1} V{bottom:.1} H{x1}" fill="none" stroke="#333" stroke-width="1"/>"##,
        p.top
    );
    let mid = p.top + PANEL_HEIGHT / 2.0;
    let _ = writeln!(
        out,
        r##"<text class="axis-label" x="22" y="{mid:.1}" font-size="12" text-anchor="middle" transform="rotate(-90 22 {mid:.1})">{}</text>"##,
        escape(y_label)
    );
    let _ = writeln!(
        out,
        r##"<text class="axis-label" x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">seconds since start</text>"##,
        (x0 + x1) / 2.0,
        bottom + 34.0
    );
}

/// One series: polylines over consecutive seconds that have a value, markers, a legend entry.
fn series(out: &mut String, p: &Panel, seconds: &[SecondReport], s: &Series, legend_row: usize) {
    let _ = writeln!(
        out,
        r##"<g class="series" data-series="{}" fill="none" stroke="{}" stroke-width="2" stroke-linejoin="round">"##,
        s.name, s.colour
    );
    let _ = writeln!(out, "<title>{}</title>", escape(s.label));
    let points: Vec<Option<(f64, f64)>> = seconds
        .iter()
        .map(|sec| {
            // A point sits in the middle of the time its second covers (the last one is short).
            (s.value)(sec).map(|v| {
                (
                    p.x(sec.second as f64 + sec.span_secs / 2.0),
                    p.y(v.min(p.y_max)),
                )
            })
        })
        .collect();
    for run in points.split(|pt| pt.is_none()).filter(|r| !r.is_empty()) {
        let coords: Vec<String> = run
            .iter()
            .flatten()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(out, r##"<polyline points="{}"/>"##, coords.join(" "));
    }
    let present = points.iter().flatten().count();
    if present <= MARKERS_MAX {
        for (x, y) in points.iter().flatten() {
            let _ = writeln!(
                out,
                r##"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="{}" stroke="none"/>"##,
                s.colour
            );
        }
    }
    let _ = writeln!(out, "</g>");
    let (lx, ly) = (
        WIDTH - RIGHT + 20.0,
        p.top + 10.0 + 22.0 * legend_row as f64,
    );
    let _ = writeln!(
        out,
        r##"<g class="legend" data-series="{}"><line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text></g>"##,
        s.name,
        lx + 24.0,
        s.colour,
        lx + 30.0,
        ly + 4.0,
        escape(s.label)
    );
}

fn max_of(seconds: &[SecondReport], series: &[Series]) -> f64 {
    seconds
        .iter()
        .flat_map(|sec| series.iter().filter_map(|s| (s.value)(sec)))
        .fold(0.0, f64::max)
}

/// The report's timeline as an SVG document.
pub fn render_svg(report: &Report) -> String {
    let seconds = &report.timeline.seconds;
    let c = &report.config;
    let x_extent = seconds
        .last()
        .map_or(1.0, |s| s.second as f64 + s.span_secs)
        .max(1.0);
    // The time axis ends with the run (ticks at round seconds within it), not at the next
    // round number: a 20.6 s run should not leave a fifth of the chart empty.
    let (x_step, _) = nice_axis(x_extent, 10);
    let x_max = x_extent;
    let counts: [Series; 3] = [
        Series {
            name: "ok",
            label: "ok",
            colour: "#2e7d32",
            value: &|s| Some(s.ok as f64),
        },
        Series {
            name: "out_of_stock",
            label: "out of stock",
            colour: "#ef6c00",
            value: &|s| Some(s.out_of_stock as f64),
        },
        Series {
            name: "error",
            label: "error",
            colour: "#c62828",
            value: &|s| Some(s.error as f64),
        },
    ];
    let latencies: [Series; 2] = [
        Series {
            name: "p50",
            label: "p50",
            colour: "#1565c0",
            value: &|s| s.p50_ms,
        },
        Series {
            name: "p99",
            label: "p99",
            colour: "#6a1b9a",
            value: &|s| s.p99_ms,
        },
    ];
    let (count_step, count_max) = nice_axis(max_of(seconds, &counts), 5);
    let (latency_step, latency_max) = nice_axis(max_of(seconds, &latencies), 5);
    let throughput = Panel {
        top: THROUGHPUT_TOP,
        x_max,
        y_max: count_max,
    };
    let latency = Panel {
        top: LATENCY_TOP,
        x_max,
        y_max: latency_max,
    };

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

    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">"##
    );
    let _ = writeln!(out, "<title>{}</title>", escape(&title));
    let _ = writeln!(
        out,
        r##"<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        out,
        r##"<text class="title" x="{LEFT}" y="28" font-size="17" font-weight="bold">{}</text>"##,
        escape(&title)
    );
    let _ = writeln!(
        out,
        r##"<text class="subtitle" x="{LEFT}" y="50" font-size="12" fill="#555">{}</text>"##,
        escape(&subtitle)
    );
    axes(
        &mut out,
        &throughput,
        x_step,
        count_step,
        "throughput: operations completed per second",
        "operations / s",
    );
    for (row, s) in counts.iter().enumerate() {
        series(&mut out, &throughput, seconds, s, row);
    }
    axes(
        &mut out,
        &latency,
        x_step,
        latency_step,
        "latency of the operations completed in each second",
        "latency (ms)",
    );
    for (row, s) in latencies.iter().enumerate() {
        series(&mut out, &latency, seconds, s, row);
    }
    let _ = writeln!(out, "</svg>");
    out
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
            skus: 10,
            prefix: "p".into(),
            skew: "zipf:1.1".into(),
            concurrency: 4,
            rate: None,
            late_ms: 10,
            duration_secs: Some(4.0),
            requests: None,
            quantity: 1,
            ttl_seconds: 3600,
            confirm_ratio: 0.5,
            release_ratio: 0.3,
            order_ratio: 0.0,
            order_lines: 2,
            seed: 42,
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

    /// (x, y) pairs of every polyline of one series.
    fn points(doc: &roxmltree::Document, series: &str) -> Vec<Vec<(f64, f64)>> {
        let group = doc
            .descendants()
            .find(|n| {
                n.has_tag_name("g")
                    && n.attribute("class") == Some("series")
                    && n.attribute("data-series") == Some(series)
            })
            .unwrap_or_else(|| panic!("no series {series}"));
        group
            .children()
            .filter(|n| n.has_tag_name("polyline"))
            .map(|line| {
                line.attribute("points")
                    .expect("points")
                    .split(' ')
                    .map(|xy| {
                        let (x, y) = xy.split_once(',').expect("x,y");
                        (x.parse().expect("x"), y.parse().expect("y"))
                    })
                    .collect()
            })
            .collect()
    }

    fn texts(doc: &roxmltree::Document, class: &str) -> Vec<String> {
        doc.descendants()
            .filter(|n| n.attribute("class") == Some(class))
            .flat_map(|n| {
                n.descendants()
                    .filter(|t| t.is_text())
                    .filter_map(|t| t.text())
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned)
            })
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
        let svg = render_svg(&r);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(
            root.tag_name().namespace(),
            Some("http://www.w3.org/2000/svg")
        );
        // Self-contained: nothing to load or run.
        assert!(!svg.contains("<script") && !svg.contains("href"), "{svg}");

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
        // Geometry: x grows with time, the last point sits in the middle of its half second;
        // the busiest second is the highest ok point (smallest y).
        let ok = &points(&doc, "ok")[0];
        assert!(ok.windows(2).all(|w| w[0].0 < w[1].0), "{ok:?}");
        // The run covers 3.5 s, and so does the time axis (steps of 0.5 s).
        let x_of = |t: f64| LEFT + (WIDTH - LEFT - RIGHT) * t / 3.5;
        assert!((ok[0].0 - x_of(0.5)).abs() < 0.1 && (ok[3].0 - x_of(3.25)).abs() < 0.1);
        let top = ok.iter().map(|p| p.1).fold(f64::MAX, f64::min);
        assert_eq!(top, ok[1].1);
        let p99 = points(&doc, "p99").concat();
        assert!(p99.iter().all(|(_, y)| *y >= LATENCY_TOP - 0.01), "{p99:?}");

        let labels = texts(&doc, "axis-label");
        for label in ["operations / s", "latency (ms)", "seconds since start"] {
            assert!(labels.iter().any(|l| l == label), "{label} in {labels:?}");
        }
        let legend: Vec<_> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("legend"))
            .filter_map(|n| n.attribute("data-series"))
            .collect();
        assert_eq!(legend, ["ok", "out_of_stock", "error", "p50", "p99"]);
        // Counts axis: 0..100 in steps of 20, then the latency axis: 0..20 ms in steps of 5.
        let y_ticks = texts(&doc, "y-ticks");
        assert_eq!(
            y_ticks,
            ["0", "20", "40", "60", "80", "100", "0", "5", "10", "15", "20"]
        );
        let x_ticks = texts(&doc, "x-ticks");
        assert_eq!(x_ticks.len(), 16, "8 ticks per panel: {x_ticks:?}");
        assert_eq!((x_ticks[0].as_str(), x_ticks[7].as_str()), ("0.0", "3.5"));
        // The run id is escaped, not markup.
        assert!(texts(&doc, "title").iter().any(|t| t.contains("r<&>")));
    }

    #[test]
    fn svg_of_an_empty_run_is_still_valid() {
        let svg = render_svg(&report(Vec::new()));
        let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
        assert!(points(&doc, "ok").is_empty());
        assert!(points(&doc, "p99").is_empty());
    }
}
