//! The report as one self-contained HTML page: no network at view time,
//! no script library. Every chart is SVG drawn here; hovering a shape
//! shows its `<title>`; a few lines of inline script link the DAG to the
//! timeline and filter the release's items.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::data::{ATTEMPTS_DRAWN, Release, Report, StageNode};
use super::layout;
use super::palette;
use crate::cli::render;
use crate::store::{ClassCount, ItemAttempt, StageRun};

/// The page of `report`.
pub fn render(report: &Report) -> String {
    let mut page = String::with_capacity(64 * 1024);
    let title = format!("{} — run {}", report.pipeline, report.run.id);
    let _ = write!(
        page,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"generator\" content=\"cairn {}\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        env!("CARGO_PKG_VERSION"),
        esc(&title)
    );
    header(&mut page, report);
    page.push_str(
        "<nav><a href=\"#dag\">Stages</a> <a href=\"#timeline\">Timeline</a> \
         <a href=\"#outcomes\">Item outcomes</a> <a href=\"#slowest\">Slowest items</a> \
         <a href=\"#troubled\">Retries and infra</a> <a href=\"#samples\">pass@k</a> \
         <a href=\"#release\">Release</a> <a href=\"#runs\">Runs</a></nav>\n<main>\n",
    );
    dag(&mut page, report);
    timeline(&mut page, report);
    outcomes(&mut page, report);
    slowest(&mut page, report);
    troubled(&mut page, report);
    samples(&mut page, report);
    releases(&mut page, report);
    runs(&mut page, report);
    let _ = write!(
        page,
        "</main>\n<script>{SCRIPT}</script>\n</body>\n</html>\n"
    );
    page
}

/// Text for HTML and SVG: `&`, `<`, `>` and quotes escaped.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `2.31s`, `4m05s`.
fn took(ms: i64) -> String {
    render::elapsed(std::time::Duration::from_millis(ms.max(0) as u64))
}

/// An anchor name for an item of a release.
fn item_anchor(release: &str, id: &str) -> String {
    let safe: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("item-{release}-{safe}-{:x}", fnv1a(id))
}

fn fnv1a(text: &str) -> u32 {
    text.bytes()
        .fold(2166136261u32, |h, b| (h ^ b as u32).wrapping_mul(16777619))
}

fn header(page: &mut String, report: &Report) {
    let run = &report.run;
    let mut about = vec![
        format!("run {}", run.id),
        format!("<span class=\"status s-{0}\">{0}</span>", esc(&run.status)),
        format!("started {}", esc(&render::time(run.started_ms))),
    ];
    if let Some(finished) = run.finished_ms {
        about.push(format!("took {}", took(finished - run.started_ms)));
    }
    if let Some(profile) = &report.profile {
        about.push(format!("profile {}", esc(profile)));
    }
    if let Some(version) = &run.cairn_version {
        about.push(format!("cairn {}", esc(version)));
    }
    if let Some(digest) = &run.manifest_digest {
        about.push(format!(
            "manifest <code title=\"{0}\">{1}</code>",
            esc(digest),
            esc(&digest[..digest.len().min(12)])
        ));
    }
    let _ = writeln!(
        page,
        "<header><h1>{}</h1><p class=\"about\">{}</p><p class=\"command\"><code>{}</code></p>",
        esc(&report.pipeline),
        about.join(" · "),
        esc(&run.command)
    );
    // The run's stages by state, and the stages by their state now.
    let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
    let mut now: BTreeMap<&str, usize> = BTreeMap::new();
    for stage in &report.stages {
        if let Some(run) = &stage.run {
            *by_state.entry(&run.state).or_default() += 1;
        }
        *now.entry(&stage.status).or_default() += 1;
    }
    page.push_str("<div class=\"cards\">");
    let card = |page: &mut String, kind: &str, state: &str, n: usize, label: &str| {
        let _ = write!(
            page,
            "<div class=\"card\" style=\"border-color:{}\"><span class=\"n\" data-{kind}=\"{}\">{n}</span> {}</div>",
            palette::fill(state),
            esc(state),
            esc(label)
        );
    };
    for (state, n) in &by_state {
        card(page, "run-count", state, *n, state);
    }
    page.push_str("</div>\n<div class=\"cards now\"><span class=\"label\">now:</span>");
    for (state, n) in &now {
        card(page, "status-count", state, *n, state);
    }
    page.push_str("</div>\n</header>\n");
}

const NODE_W: f64 = 150.0;
const NODE_H: f64 = 38.0;
const GAP_X: f64 = 18.0;
const GAP_Y: f64 = 34.0;

fn dag(page: &mut String, report: &Report) {
    page.push_str("<section id=\"dag\"><h2>Stages</h2>\n<p class=\"hint\">Coloured by what the run did with each stage; hover for why, click to find it on the timeline.</p>\n");
    legend(
        page,
        report
            .stages
            .iter()
            .map(|s| stage_state(s).to_owned())
            .collect(),
        palette::fill,
    );
    let names: Vec<&str> = report.stages.iter().map(|s| s.name.as_str()).collect();
    let upstream: Vec<Vec<&str>> = report
        .stages
        .iter()
        .map(|s| s.upstream.iter().map(String::as_str).collect())
        .collect();
    let places = layout::layered(&names, &upstream);
    let columns = places.iter().map(|p| p.column + 1).max().unwrap_or(1);
    let layers = places.iter().map(|p| p.layer + 1).max().unwrap_or(1);
    // Room on the right for edges that pass stages by.
    let width = columns as f64 * (NODE_W + GAP_X) + GAP_X + 60.0 + 6.0 * layers as f64;
    let height = layers as f64 * (NODE_H + GAP_Y) + GAP_Y / 2.0;
    // Rows narrower than the widest are centred.
    let mut in_layer = vec![0usize; layers];
    for p in &places {
        in_layer[p.layer] += 1;
    }
    let centre = |i: usize| -> (f64, f64) {
        let p = places[i];
        let offset = (columns - in_layer[p.layer]) as f64 * (NODE_W + GAP_X) / 2.0;
        let x = GAP_X + offset + p.column as f64 * (NODE_W + GAP_X) + NODE_W / 2.0;
        let y = GAP_Y / 2.0 + p.layer as f64 * (NODE_H + GAP_Y) + NODE_H / 2.0;
        (x, y)
    };
    let _ = write!(
        page,
        "<svg class=\"dag\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" role=\"img\" aria-label=\"stage graph\">\n\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#777\"/></marker></defs>\n"
    );
    let index: std::collections::HashMap<&str, usize> =
        names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    for (from, to) in &report.edges {
        let (Some(&a), Some(&b)) = (index.get(from.as_str()), index.get(to.as_str())) else {
            continue;
        };
        let (x1, y1) = centre(a);
        let (x2, y2) = centre(b);
        let (y1, y2) = (y1 + NODE_H / 2.0, y2 - NODE_H / 2.0);
        let span = places[b].layer.saturating_sub(places[a].layer);
        let path = if span > 1 {
            // Past the stages in between: out to the right, and back.
            let out = x1.max(x2) + NODE_W / 2.0 + 8.0 + 6.0 * span as f64;
            format!(
                "M{x1:.1},{y1:.1} C{out:.1},{:.1} {out:.1},{:.1} {x2:.1},{y2:.1}",
                y1 + GAP_Y,
                y2 - GAP_Y
            )
        } else {
            let mid = (y1 + y2) / 2.0;
            format!("M{x1:.1},{y1:.1} C{x1:.1},{mid:.1} {x2:.1},{mid:.1} {x2:.1},{y2:.1}")
        };
        let _ = writeln!(
            page,
            "<path class=\"{}\" d=\"{path}\" marker-end=\"url(#arrow)\"><title>{} → {}</title></path>",
            if span > 1 { "edge skip" } else { "edge" },
            esc(from),
            esc(to)
        );
    }
    for (i, stage) in report.stages.iter().enumerate() {
        let (x, y) = centre(i);
        let state = stage_state(stage);
        let why = stage
            .run
            .as_ref()
            .and_then(|r| match (&r.reason, &r.message) {
                (Some(reason), Some(message)) => Some(format!("{reason}: {message}")),
                (reason, message) => reason.clone().or(message.clone()),
            });
        let mut hover = format!("{}: {state}", stage.name);
        if let Some(why) = why {
            let _ = write!(hover, " — {why}");
        }
        let _ = write!(hover, "\nnow: {}", stage.status);
        if let Some(reason) = &stage.status_reason {
            let _ = write!(hover, " ({reason})");
        }
        if stage.imported > 0 {
            let _ = write!(
                hover,
                "\n{} item outcome(s) imported (`cairn import`), not run by cairn",
                stage.imported
            );
        }
        let label = if stage.name.chars().count() > 20 {
            format!("{}…", stage.name.chars().take(19).collect::<String>())
        } else {
            stage.name.clone()
        };
        let _ = writeln!(
            page,
            "<g class=\"node\" data-stage=\"{name}\" data-state=\"{state_attr}\" tabindex=\"0\"><title>{hover}</title>\
             <rect x=\"{:.1}\" y=\"{:.1}\" width=\"{NODE_W}\" height=\"{NODE_H}\" rx=\"6\" fill=\"{}\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" class=\"name\">{}</text>\
             <text x=\"{x:.1}\" y=\"{:.1}\" class=\"state\">{state_attr}{}</text></g>",
            x - NODE_W / 2.0,
            y - NODE_H / 2.0,
            palette::fill(state),
            y - 2.0,
            esc(&label),
            y + 12.0,
            if stage.per_item { " · per item" } else { "" },
            name = esc(&stage.name),
            hover = esc(&hover),
            state_attr = esc(state),
        );
    }
    page.push_str("</svg>\n</section>\n");
}

/// What the report's run did with a stage, or `not selected`.
fn stage_state(stage: &StageNode) -> &str {
    stage
        .run
        .as_ref()
        .map_or("not selected", |r| r.state.as_str())
}

fn legend(page: &mut String, mut names: Vec<String>, colour: fn(&str) -> &'static str) {
    names.sort();
    names.dedup();
    page.push_str("<p class=\"legend\">");
    for name in names {
        let _ = write!(
            page,
            "<span><i style=\"background:{}\"></i>{}</span>",
            colour(&name),
            esc(&name)
        );
    }
    page.push_str("</p>\n");
}

/// A stage executed in the run: it has a bar on the timeline.
fn executed(run: &StageRun) -> bool {
    matches!(
        run.state.as_str(),
        "ran" | "failed" | "partial" | "interrupted"
    ) && run.started_ms.is_some()
}

const LABEL_W: f64 = 190.0;
const CHART_W: f64 = 900.0;
const ROW_H: f64 = 22.0;
const LANE_H: f64 = 7.0;
/// Item lanes drawn per stage at most; further attempts share the last.
const MAX_LANES: usize = 24;

fn timeline(page: &mut String, report: &Report) {
    page.push_str("<section id=\"timeline\"><h2>Timeline</h2>\n");
    let start = report.run.started_ms;
    let spans: Vec<&StageRun> = report
        .stages
        .iter()
        .filter_map(|s| s.run.as_ref())
        .collect();
    let end = spans
        .iter()
        .filter_map(|s| s.finished_ms)
        .chain(report.attempts.iter().map(|a| a.finished_ms))
        .chain(report.run.finished_ms)
        .max()
        .unwrap_or(start)
        .max(start + 1);
    let _ = writeln!(
        page,
        "<p class=\"hint\">Stages that executed, by executor; under a per-item stage, its item attempts ({} of {} drawn: every one that did not end ok, then the longest), coloured by class. Fresh and restored stages are ticks.</p>",
        report.attempts.len(),
        report.attempts_total
    );
    if report.attempts_total > ATTEMPTS_DRAWN {
        let _ = writeln!(
            page,
            "<p class=\"hint\">{} attempts were not drawn.</p>",
            report.attempts_total - report.attempts.len()
        );
    }
    let x = |ms: i64| LABEL_W + (ms - start) as f64 / (end - start) as f64 * CHART_W;
    // Rows: executors in name order, their stages in start order.
    let mut rows: Vec<&StageRun> = spans.clone();
    // Stages that never started (blocked, stopped) after the others.
    rows.sort_by_key(|s| {
        let at = s.started_ms.or(s.ready_ms);
        (s.executor.clone(), at.is_none(), at, s.stage.clone())
    });
    let mut attempts: BTreeMap<&str, Vec<&ItemAttempt>> = BTreeMap::new();
    for a in &report.attempts {
        attempts.entry(&a.stage).or_default().push(a);
    }
    // Each stage's attempts packed into lanes: an attempt takes the first
    // lane free when it starts.
    let mut lanes: BTreeMap<&str, Vec<(usize, &ItemAttempt)>> = BTreeMap::new();
    let mut lane_count: BTreeMap<&str, usize> = BTreeMap::new();
    for (stage, list) in &attempts {
        let mut ends: Vec<i64> = Vec::new();
        let mut placed = Vec::new();
        for a in list {
            let lane = match ends.iter().position(|&e| e <= a.started_ms) {
                Some(lane) => lane,
                None if ends.len() < MAX_LANES => {
                    ends.push(i64::MIN);
                    ends.len() - 1
                }
                None => MAX_LANES - 1,
            };
            ends[lane] = ends[lane].max(a.finished_ms);
            placed.push((lane, *a));
        }
        lane_count.insert(stage, ends.len());
        lanes.insert(stage, placed);
    }
    let mut height = 30.0;
    let mut executor = "";
    for row in &rows {
        if row.executor != executor {
            height += ROW_H;
        }
        executor = &row.executor;
        height += ROW_H + lane_count.get(row.stage.as_str()).copied().unwrap_or(0) as f64 * LANE_H;
    }
    let width = LABEL_W + CHART_W + 20.0;
    let _ = writeln!(
        page,
        "<svg class=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" role=\"img\" aria-label=\"timeline\">"
    );
    let ticks = 8;
    for t in 0..=ticks {
        let ms = start + (end - start) * t / ticks;
        let tx = x(ms);
        let _ = writeln!(
            page,
            "<line class=\"grid\" x1=\"{tx:.1}\" y1=\"18\" x2=\"{tx:.1}\" y2=\"{height:.0}\"/><text class=\"tick\" x=\"{tx:.1}\" y=\"12\">{}</text>",
            took(ms - start)
        );
    }
    let mut y = 24.0;
    let mut executor = "";
    for row in rows {
        if row.executor != executor {
            let _ = writeln!(
                page,
                "<text class=\"lane\" x=\"4\" y=\"{:.1}\">{} @ {}</text>",
                y + 15.0,
                esc(&row.executor),
                esc(&row.host)
            );
            y += ROW_H;
        }
        executor = &row.executor;
        let _ = writeln!(
            page,
            "<text class=\"label\" x=\"14\" y=\"{:.1}\">{}</text>",
            y + 15.0,
            esc(&row.stage)
        );
        let hover = |what: &str| {
            let mut text = format!("{}: {}", row.stage, what);
            if let Some(reason) = &row.reason {
                let _ = write!(text, " — {reason}");
            }
            if let Some(message) = &row.message {
                let _ = write!(text, "; {message}");
            }
            esc(&text)
        };
        match (row.started_ms, row.finished_ms) {
            (Some(s), Some(f)) if executed(row) => {
                let (x1, x2) = (x(s), x(f).max(x(s) + 2.0));
                let _ = writeln!(
                    page,
                    "<rect class=\"stage-bar\" data-stage=\"{}\" data-state=\"{}\" x=\"{x1:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"14\" rx=\"3\" fill=\"{}\"><title>{}</title></rect>",
                    esc(&row.stage),
                    esc(&row.state),
                    y + 3.0,
                    x2 - x1,
                    palette::fill(&row.state),
                    hover(&format!("{} in {}", row.state, took(f - s)))
                );
                if let Some(h) = row.hashed_ms {
                    let hx = x(h);
                    let _ = writeln!(
                        page,
                        "<line class=\"hashed\" x1=\"{hx:.1}\" y1=\"{:.1}\" x2=\"{hx:.1}\" y2=\"{:.1}\"><title>outputs hashed at +{}</title></line>",
                        y + 1.0,
                        y + 19.0,
                        took(h - start)
                    );
                }
            }
            (None, _) if row.ready_ms.is_none() => {
                let _ = writeln!(
                    page,
                    "<text class=\"never\" data-stage=\"{}\" x=\"{LABEL_W}\" y=\"{:.1}\">{}<title>{}</title></text>",
                    esc(&row.stage),
                    y + 15.0,
                    esc(&row.state),
                    hover(&row.state)
                );
            }
            (started, _) => {
                let at = started
                    .or(row.ready_ms)
                    .or(row.finished_ms)
                    .unwrap_or(start);
                let _ = writeln!(
                    page,
                    "<rect class=\"stage-tick\" data-stage=\"{}\" data-state=\"{}\" x=\"{:.1}\" y=\"{:.1}\" width=\"3\" height=\"14\" fill=\"{}\"><title>{}</title></rect>",
                    esc(&row.stage),
                    esc(&row.state),
                    x(at),
                    y + 3.0,
                    palette::fill(&row.state),
                    hover(&row.state)
                );
            }
        }
        y += ROW_H;
        if let Some(placed) = lanes.get(row.stage.as_str()) {
            for (lane, a) in placed {
                let (x1, x2) = (x(a.started_ms), x(a.finished_ms).max(x(a.started_ms) + 1.0));
                let _ = writeln!(
                    page,
                    "<rect class=\"item-bar\" data-class=\"{}\" x=\"{x1:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{} {} (attempt {}): {} in {}</title></rect>",
                    esc(&a.class),
                    y + *lane as f64 * LANE_H,
                    x2 - x1,
                    LANE_H - 1.0,
                    palette::class(&a.class),
                    esc(&a.stage),
                    esc(&a.key),
                    a.attempt,
                    esc(&a.class),
                    took(a.finished_ms - a.started_ms)
                );
            }
            y += lane_count.get(row.stage.as_str()).copied().unwrap_or(0) as f64 * LANE_H;
        }
    }
    page.push_str("</svg>\n");
    let classes: Vec<String> = report.attempts.iter().map(|a| a.class.clone()).collect();
    if !classes.is_empty() {
        legend(page, classes, palette::class);
    }
    page.push_str("</section>\n");
}

/// A stacked bar per row (a run and stage code, or a stage code), its
/// segments the classes, scaled to the largest row.
fn stacked(page: &mut String, rows: &[(String, Vec<&ClassCount>)], css: &str) {
    let most = rows
        .iter()
        .map(|(_, counts)| counts.iter().map(|c| c.count).sum::<u64>())
        .max()
        .unwrap_or(1)
        .max(1);
    let bar_w = 560.0;
    let height = rows.len() as f64 * ROW_H + 6.0;
    let width = LABEL_W + bar_w + 120.0;
    let _ = writeln!(
        page,
        "<svg class=\"{css}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\">"
    );
    for (r, (label, counts)) in rows.iter().enumerate() {
        let y = r as f64 * ROW_H + 3.0;
        let _ = writeln!(
            page,
            "<text class=\"label\" x=\"4\" y=\"{:.1}\">{}</text>",
            y + 13.0,
            esc(label)
        );
        let mut x = LABEL_W;
        let total: u64 = counts.iter().map(|c| c.count).sum();
        for c in counts {
            let w = c.count as f64 / most as f64 * bar_w;
            let _ = writeln!(
                page,
                "<rect class=\"segment\" data-class=\"{}\" data-count=\"{}\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"16\" fill=\"{}\"><title>{}: {} {} of {total}</title></rect>",
                esc(&c.class),
                c.count,
                palette::class(&c.class),
                esc(label),
                c.count,
                esc(&c.class)
            );
            x += w;
        }
        let _ = writeln!(
            page,
            "<text class=\"total\" x=\"{:.1}\" y=\"{:.1}\">{total}</text>",
            x + 6.0,
            y + 13.0
        );
    }
    page.push_str("</svg>\n");
}

fn short_code(code: &Option<String>) -> String {
    match code {
        Some(code) => {
            let hex = code.strip_prefix("blake3:").unwrap_or(code);
            format!("code {}", &hex[..hex.len().min(8)])
        }
        None => "code unknown".to_owned(),
    }
}

fn outcomes(page: &mut String, report: &Report) {
    page.push_str("<section id=\"outcomes\"><h2>Item outcomes</h2>\n");
    // In the pipeline's order.
    let stages: Vec<&str> = report
        .stages
        .iter()
        .map(|s| s.name.as_str())
        .filter(|name| {
            report
                .outcomes_by_run
                .iter()
                .chain(&report.outcomes_now)
                .any(|c| c.stage == *name)
        })
        .collect();
    if stages.is_empty() {
        page.push_str("<p class=\"empty\">No per-item stage has run.</p>\n</section>\n");
        return;
    }
    page.push_str("<p class=\"hint\">Per per-item stage: the classes its items ended in, in each run that attempted them and by the version of the stage's code (its template's fingerprint); then every item's outcome now.</p>\n");
    for stage in stages {
        let _ = writeln!(
            page,
            "<h3 class=\"stage-outcomes\" data-stage=\"{0}\">{0}</h3>",
            esc(stage)
        );
        let mut by_run: BTreeMap<(i64, String), Vec<&ClassCount>> = BTreeMap::new();
        for c in report.outcomes_by_run.iter().filter(|c| c.stage == stage) {
            by_run
                .entry((c.run_id.unwrap_or(0), short_code(&c.code)))
                .or_default()
                .push(c);
        }
        let rows: Vec<(String, Vec<&ClassCount>)> = by_run
            .into_iter()
            .map(|((run, code), counts)| (format!("run {run} · {code}"), counts))
            .collect();
        if !rows.is_empty() {
            stacked(page, &rows, "outcomes-by-run");
        }
        let mut now: BTreeMap<String, Vec<&ClassCount>> = BTreeMap::new();
        for c in report.outcomes_now.iter().filter(|c| c.stage == stage) {
            now.entry(format!("now · {}", short_code(&c.code)))
                .or_default()
                .push(c);
        }
        let rows: Vec<(String, Vec<&ClassCount>)> = now.into_iter().collect();
        if !rows.is_empty() {
            stacked(page, &rows, "outcomes-now");
        }
        let classes = report
            .outcomes_by_run
            .iter()
            .chain(&report.outcomes_now)
            .filter(|c| c.stage == stage)
            .map(|c| c.class.clone())
            .collect();
        legend(page, classes, palette::class);
    }
    page.push_str("</section>\n");
}

fn slowest(page: &mut String, report: &Report) {
    page.push_str("<section id=\"slowest\"><h2>Slowest items</h2>\n");
    if report.slowest.is_empty() {
        page.push_str("<p class=\"empty\">The run attempted no item.</p>\n</section>\n");
        return;
    }
    page.push_str("<table><thead><tr><th>stage</th><th>item</th><th>attempt</th><th>class</th><th>took</th><th>exit</th><th>log</th></tr></thead><tbody>\n");
    for a in &report.slowest {
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td><i class=\"dot\" style=\"background:{}\"></i>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(&a.stage),
            esc(&a.key),
            a.attempt,
            palette::class(&a.class),
            esc(&a.class),
            took(a.finished_ms - a.started_ms),
            a.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            log_name(a.log_path.as_deref())
        );
    }
    page.push_str("</tbody></table>\n</section>\n");
}

/// A log file's name, its whole path on hover.
fn log_name(path: Option<&str>) -> String {
    let Some(path) = path else {
        return String::new();
    };
    let name = path.rsplit('/').next().unwrap_or(path);
    format!("<code title=\"{}\">{}</code>", esc(path), esc(name))
}

fn troubled(page: &mut String, report: &Report) {
    page.push_str("<section id=\"troubled\"><h2>Retries and infra failures</h2>\n");
    if report.troubled.is_empty() {
        page.push_str("<p class=\"empty\">No item was retried or failed on infrastructure in this run.</p>\n</section>\n");
        return;
    }
    page.push_str("<table><thead><tr><th>stage</th><th>item</th><th>attempts</th><th>classes, in order</th></tr></thead><tbody>\n");
    for t in &report.troubled {
        let _ = writeln!(
            page,
            "<tr class=\"troubled\"><td>{}</td><td><code>{}</code></td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(&t.stage),
            esc(&t.item),
            t.attempts,
            esc(&t.classes.join(" → "))
        );
    }
    page.push_str("</tbody></table>\n</section>\n");
}

fn samples(page: &mut String, report: &Report) {
    page.push_str("<section id=\"samples\"><h2>pass@k</h2>\n");
    if report.samples.is_empty() {
        page.push_str("<p class=\"empty\">No stage draws samples.</p>\n</section>\n");
        return;
    }
    for summary in &report.samples {
        let stage = summary["stage"].as_str().unwrap_or("");
        let ks: Vec<u64> = summary["samples"]["pass_at"]
            .as_array()
            .map(|ks| ks.iter().filter_map(|k| k.as_u64()).collect())
            .unwrap_or_default();
        let _ = writeln!(
            page,
            "<h3 class=\"sampled\" data-stage=\"{0}\">{0}</h3><p class=\"hint\">k = {1} samples per item, seed {2}; denominator: {3}.</p>",
            esc(stage),
            summary["samples"]["k"],
            summary["samples"]["seed"],
            esc(summary["denominator"].as_str().unwrap_or(""))
        );
        for (protocol, section) in crate::cli::show::sections(summary) {
            if let Some(name) = protocol {
                let _ = writeln!(
                    page,
                    "<h4 class=\"protocol\">{} = {} <span class=\"hint\">(this protocol's figures alone)</span></h4>",
                    esc(summary["protocol_by"].as_str().unwrap_or("protocol")),
                    esc(name)
                );
            }
            passk_table(page, section, &ks);
        }
    }
    page.push_str("</section>\n");
}

/// One section's pass@k table (all, each sub-list) and its comparisons.
fn passk_table(page: &mut String, section: &serde_json::Value, ks: &[u64]) {
    page.push_str("<table class=\"passk\"><thead><tr><th>items</th><th>count</th><th>samples</th><th>valid</th><th>passed</th><th>error</th><th>infra</th>");
    for k in ks {
        let _ = write!(page, "<th>pass@{k}</th>");
    }
    page.push_str("<th>groups</th></tr></thead><tbody>\n");
    let mut scopes = vec![("all".to_owned(), &section["all"])];
    if let Some(splits) = section["splits"].as_object() {
        let by = section["split_by"].as_str().unwrap_or("split");
        scopes.extend(splits.iter().map(|(name, s)| (format!("{by} = {name}"), s)));
    }
    for (scope, s) in scopes {
        let _ = write!(
            page,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>",
            esc(&scope),
            s["items"],
            s["requested"],
            s["valid"],
            s["passed"],
            s["error"],
            s["infra"]
        );
        for k in ks {
            let value = s[format!("pass@{k}")].as_f64();
            let _ = write!(
                page,
                "<td class=\"num passk-value\">{}</td>",
                value
                    .map(|v| format!("{v:.3}"))
                    .unwrap_or_else(|| "—".to_owned())
            );
        }
        let groups = s["groups"]
            .as_object()
            .map(|g| {
                g.iter()
                    .map(|(name, n)| format!("{name} {n}"))
                    .collect::<Vec<_>>()
                    .join(" · ")
            })
            .unwrap_or_default();
        let _ = writeln!(page, "<td>{}</td></tr>", esc(&groups));
    }
    page.push_str("</tbody></table>\n");
    if let Some(comparisons) = section["comparisons"].as_array().filter(|c| !c.is_empty()) {
        comparison_plot(page, comparisons);
    }
}

/// Each compared pair: both pass rates as bars, the difference with its
/// 95 % interval as a whisker around zero.
fn comparison_plot(page: &mut String, comparisons: &[serde_json::Value]) {
    page.push_str("<h4>Model comparison</h4>\n");
    let row = 58.0;
    let bar_w = 300.0;
    let diff_x = LABEL_W + bar_w + 90.0;
    let diff_w = 260.0;
    let height = comparisons.len() as f64 * row + 24.0;
    let width = diff_x + diff_w + 30.0;
    let _ = writeln!(
        page,
        "<svg class=\"comparison\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\">\
         <text class=\"tick\" x=\"{LABEL_W}\" y=\"12\">pass rate</text><text class=\"tick\" x=\"{:.1}\" y=\"12\">difference (a − b), 95 % interval</text>",
        diff_x + diff_w / 2.0
    );
    // The difference axis spans ±1 at most, ±the widest interval at least.
    let reach = comparisons
        .iter()
        .flat_map(|c| {
            c["interval95"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_f64())
                .chain(c["difference"].as_f64())
        })
        .map(f64::abs)
        .fold(0.05, f64::max)
        .min(1.0);
    let dx = |v: f64| diff_x + diff_w / 2.0 + v / reach * diff_w / 2.0;
    let _ = writeln!(
        page,
        "<line class=\"zero\" x1=\"{0:.1}\" y1=\"18\" x2=\"{0:.1}\" y2=\"{height:.0}\"/>\
         <text class=\"tick\" x=\"{1:.1}\" y=\"{2:.0}\">{3:+.2}</text><text class=\"tick\" x=\"{0:.1}\" y=\"{2:.0}\">0</text><text class=\"tick\" x=\"{4:.1}\" y=\"{2:.0}\">{5:+.2}</text>",
        dx(0.0),
        dx(-reach),
        height - 2.0,
        -reach,
        dx(reach),
        reach
    );
    for (r, c) in comparisons.iter().enumerate() {
        let y = 22.0 + r as f64 * row;
        let (a, b) = (
            c["a"].as_str().unwrap_or("a"),
            c["b"].as_str().unwrap_or("b"),
        );
        for (j, (name, rate)) in [
            (a, c["pass_rate_a"].as_f64()),
            (b, c["pass_rate_b"].as_f64()),
        ]
        .into_iter()
        .enumerate()
        {
            let rate = rate.unwrap_or(0.0);
            let yy = y + j as f64 * 20.0;
            let _ = writeln!(
                page,
                "<text class=\"label\" x=\"4\" y=\"{:.1}\">{}</text><rect class=\"rate\" data-model=\"{}\" x=\"{LABEL_W}\" y=\"{yy:.1}\" width=\"{:.1}\" height=\"15\" fill=\"{}\"><title>{}: pass rate {rate:.3} over {} paired items</title></rect><text class=\"total\" x=\"{:.1}\" y=\"{:.1}\">{rate:.3}</text>",
                yy + 12.0,
                esc(name),
                esc(name),
                rate * bar_w,
                if j == 0 { "#5c6bc0" } else { "#26a69a" },
                esc(name),
                c["paired_items"],
                LABEL_W + rate * bar_w + 6.0,
                yy + 12.0
            );
        }
        if let (Some(d), Some(interval)) = (c["difference"].as_f64(), c["interval95"].as_array()) {
            let lo = interval.first().and_then(|v| v.as_f64()).unwrap_or(d);
            let hi = interval.get(1).and_then(|v| v.as_f64()).unwrap_or(d);
            let cy = y + 17.0;
            let _ = writeln!(
                page,
                "<g class=\"difference\"><title>{} − {}: {d:+.3}, 95 % interval [{lo:+.3}, {hi:+.3}]</title>\
                 <line x1=\"{:.1}\" y1=\"{cy:.1}\" x2=\"{:.1}\" y2=\"{cy:.1}\" stroke=\"#333\" stroke-width=\"2\"/>\
                 <circle cx=\"{:.1}\" cy=\"{cy:.1}\" r=\"5\" fill=\"#333\"/></g>",
                esc(a),
                esc(b),
                dx(lo),
                dx(hi),
                dx(d)
            );
        }
    }
    page.push_str("</svg>\n");
}

fn releases(page: &mut String, report: &Report) {
    page.push_str("<section id=\"release\"><h2>Release</h2>\n");
    if report.releases.is_empty() {
        page.push_str("<p class=\"empty\">No freeze in the workspace.</p>\n</section>\n");
        return;
    }
    for release in &report.releases {
        release_table(page, release);
    }
    page.push_str("</section>\n");
}

fn release_table(page: &mut String, release: &Release) {
    let files: usize =
        release.files.len() + release.items.iter().map(|i| i.files.len()).sum::<usize>();
    let _ = writeln!(
        page,
        "<h3>{} {} <small>(stage <code>{}</code>, <code>{}</code>)</small></h3>\
         <p class=\"hint\">{} items, {files} files; semantic digest <code>{}</code>. Every file links to the chain of items it came from.</p>\
         <p>Made by the stage itself: {}</p>\
         <p><input class=\"filter\" type=\"search\" placeholder=\"filter items\" data-table=\"release-{}\"></p>",
        esc(&release.name),
        esc(&release.version),
        esc(&release.stage),
        esc(&release.path),
        release.items.len(),
        esc(&release.semantic_digest),
        release
            .files
            .iter()
            .map(|f| format!("<code class=\"file\">{}</code>", esc(f)))
            .collect::<Vec<_>>()
            .join(", "),
        esc(&release.stage)
    );
    let _ = writeln!(
        page,
        "<table id=\"release-{}\" class=\"release\"><thead><tr><th>item</th><th>split</th><th>files</th></tr></thead><tbody>",
        esc(&release.stage)
    );
    for item in &release.items {
        let anchor = item_anchor(&release.stage, &item.id);
        let links: Vec<String> = item
            .files
            .iter()
            .map(|f| {
                let inside = f.strip_prefix(&format!("items/{}/", item.id)).unwrap_or(f);
                format!(
                    "<a class=\"file\" href=\"#{anchor}\" title=\"provenance of {}\">{}</a>",
                    esc(f),
                    esc(inside)
                )
            })
            .collect();
        let _ = writeln!(
            page,
            "<tr class=\"released\" data-item=\"{}\"><td><a href=\"#{anchor}\"><code>{}</code></a></td><td>{}</td><td>{}</td></tr>",
            esc(&item.id),
            esc(&item.id),
            esc(&item.split),
            links.join("<br>")
        );
    }
    page.push_str("</tbody></table>\n<h4>Provenance chains</h4>\n");
    for item in &release.items {
        let _ = write!(
            page,
            "<details class=\"chain\" id=\"{}\"><summary><code>{}</code> ({} steps)</summary><ol>",
            item_anchor(&release.stage, &item.id),
            esc(&item.id),
            item.chain.len()
        );
        for step in &item.chain {
            let class = step.class.as_deref().unwrap_or("no outcome");
            let _ = write!(
                page,
                "<li><i class=\"dot\" style=\"background:{}\"></i><b>{}</b> <code>{}</code>: {} after {} attempt(s){}, code {}{}</li>",
                palette::class(class),
                esc(&step.stage),
                esc(&step.item),
                esc(class),
                step.attempts,
                step.run_id
                    .map(|r| format!(" in run {r}"))
                    .unwrap_or_default(),
                esc(&step.code),
                step.log
                    .as_ref()
                    .map(|l| format!(" · log {}", log_name(Some(l))))
                    .unwrap_or_default()
            );
        }
        page.push_str("</ol></details>\n");
    }
}

fn runs(page: &mut String, report: &Report) {
    page.push_str("<section id=\"runs\"><h2>Runs</h2>\n<table><thead><tr><th>run</th><th>started</th><th>status</th><th>ran</th><th>fresh</th><th>restored</th><th>failed</th><th>took</th><th>command</th></tr></thead><tbody>\n");
    for run in &report.runs {
        let _ = writeln!(
            page,
            "<tr{}><td>{}</td><td>{}</td><td><span class=\"status s-{status}\">{status}</span></td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td><code>{}</code></td></tr>",
            if run.id == report.run.id {
                " class=\"this-run\""
            } else {
                ""
            },
            run.id,
            esc(&render::time(run.started_ms)),
            run.executed,
            run.fresh,
            run.restored,
            run.failed,
            run.finished_ms
                .map(|f| took(f - run.started_ms))
                .unwrap_or_default(),
            esc(&run.command),
            status = esc(&run.status),
        );
    }
    page.push_str("</tbody></table>\n</section>\n");
}

const STYLE: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#222;background:#fafafa}
header{padding:16px 24px;background:#fff;border-bottom:1px solid #ddd}
h1{margin:0 0 4px;font-size:22px}h2{margin:28px 0 8px;font-size:18px}h3{margin:18px 0 6px;font-size:15px}h4{margin:12px 0 4px;font-size:14px}
nav{position:sticky;top:0;background:#263238;padding:6px 24px;z-index:2}nav a{color:#eceff1;margin-right:14px;text-decoration:none}
main{padding:0 24px 48px;overflow-x:auto}
.about,.command{margin:2px 0;color:#555}.hint{color:#666;margin:4px 0}.empty{color:#888;font-style:italic}
.cards{display:flex;flex-wrap:wrap;gap:8px;margin-top:8px;align-items:center}.cards .label{color:#666}
.card{border-left:6px solid #ccc;background:#f5f5f5;padding:4px 10px;border-radius:3px}.card .n{font-weight:700}
.status{padding:0 6px;border-radius:3px;background:#eee}.s-ok{background:#c8e6c9}.s-failed,.s-killed{background:#ffcdd2}.s-interrupted{background:#e1bee7}
.legend span{margin-right:12px;white-space:nowrap}.legend i,.dot{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:middle}
svg text{font:12px system-ui,sans-serif;fill:#222}svg .name{text-anchor:middle;font-weight:600}svg .state{text-anchor:middle;font-size:10px;fill:#444}
svg .never{font-style:italic;fill:#777}svg .tick{font-size:10px;fill:#666;text-anchor:middle}svg .lane{font-weight:700;fill:#37474f}svg .total{font-size:11px;fill:#444}
.edge{fill:none;stroke:#888;stroke-width:1.3}.edge.skip{stroke:#c5c5c5;stroke-width:1}.grid{stroke:#eee}.zero{stroke:#999;stroke-dasharray:3 3}.hashed{stroke:#1b5e20;stroke-width:2}
.node rect{stroke:#555;stroke-width:1}.node:hover rect,.node:focus rect{stroke:#000;stroke-width:2.5}.node{cursor:pointer;outline:none}
.stage-bar{stroke:#333;stroke-width:.6}.flash{stroke:#d50000!important;stroke-width:3!important}
table{border-collapse:collapse;background:#fff;margin:6px 0}th,td{border:1px solid #e0e0e0;padding:3px 8px;text-align:left;vertical-align:top}th{background:#eceff1}
td.num{text-align:right;font-variant-numeric:tabular-nums}tr.this-run{background:#fffde7}
details.chain{margin:2px 0}details.chain:target{background:#fff9c4}details.chain ol{margin:4px 0 8px}
a.file{font-family:ui-monospace,monospace;font-size:12px}input.filter{padding:4px 8px;width:260px}
"#;

const SCRIPT: &str = r##"
(function () {
  "use strict";
  document.querySelectorAll(".node").forEach(function (node) {
    node.addEventListener("click", function () {
      var stage = node.getAttribute("data-stage");
      var bars = document.querySelectorAll('.stage-bar, .stage-tick');
      for (var i = 0; i < bars.length; i++) {
        if (bars[i].getAttribute("data-stage") === stage) {
          bars[i].classList.add("flash");
          bars[i].scrollIntoView({ block: "center" });
          (function (bar) { setTimeout(function () { bar.classList.remove("flash"); }, 1500); })(bars[i]);
        }
      }
    });
  });
  document.querySelectorAll("input.filter").forEach(function (input) {
    input.addEventListener("input", function () {
      var table = document.getElementById(input.getAttribute("data-table"));
      if (!table) { return; }
      var needle = input.value.toLowerCase();
      table.querySelectorAll("tbody tr").forEach(function (row) {
        row.style.display = row.textContent.toLowerCase().indexOf(needle) < 0 ? "none" : "";
      });
    });
  });
  document.querySelectorAll("details.chain").forEach(function (d) {
    if (location.hash === "#" + d.id) { d.open = true; }
  });
  window.addEventListener("hashchange", function () {
    var target = document.getElementById(location.hash.slice(1));
    if (target && target.tagName === "DETAILS") { target.open = true; }
  });
  // What a test of the page (or a curious reader) can see: the script ran
  // to its end.
  document.body.setAttribute("data-script", "ran");
})();
"##;
