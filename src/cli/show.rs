//! `cairn show STAGE`.

use std::collections::HashSet;

use serde::Serialize;

use super::args::{Global, ShowArgs};
use super::error::CliError;
use super::render;
use super::targets::PathTarget;
use super::workspace;
use crate::schedule::{self, StageStatus};
use crate::store::{COMMAND_ITEM, ItemAttempt, ResultRecord};

#[derive(Serialize)]
struct ShowJson<'a> {
    stage: &'a str,
    description: Option<&'a str>,
    command: String,
    inputs: Vec<(&'a str, &'a str)>,
    status: &'a StageStatus,
    /// Per-item stages: the fingerprint of the stage's code.
    code: Option<String>,
    /// The current result: what the workspace holds (the lock file's).
    last_ok: Option<&'a ResultRecord>,
    last_attempt: Option<&'a ResultRecord>,
    /// A plain stage's command: every attempt under its current
    /// fingerprint, oldest first (each item's are under `STAGE/KEY`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    attempts: Vec<ItemAttempt>,
    /// A sampled stage's summary over the samples recorded now (the keys
    /// of its `samples.summary` output).
    #[serde(skip_serializing_if = "Option::is_none")]
    samples: Option<serde_json::Value>,
    /// The `[services]` its commands reach: name → where.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    services: std::collections::BTreeMap<&'a str, String>,
}

pub fn show(global: &Global, args: &ShowArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let target = match loaded.manifest.stage(&args.stage) {
        Some(_) => loaded.stage_indices(std::slice::from_ref(&args.stage))?,
        None => match loaded.path_target(&args.stage)? {
            PathTarget::Output { stage, .. } => vec![stage],
            other => match args.stage.split_once('/') {
                Some((stage, key)) if loaded.manifest.stage(stage).is_some() => {
                    return show_item(&loaded, stage, key, args.json);
                }
                // `typo/ITEM`: the stage is what is wrong.
                Some((stage, _)) if !std::path::Path::new(stage).exists() => {
                    return Err(loaded.unknown_stage(stage));
                }
                _ if args.stage.contains(['/', '.']) => {
                    return Err(loaded.not_an_output(&args.stage, &other));
                }
                _ => return Err(loaded.unknown_stage(&args.stage)),
            },
        },
    };
    let selected = loaded.dag.upstream_closure(&target);
    let mut ctx = loaded.read_context()?;
    let statuses = schedule::evaluate(&mut ctx, &selected, &HashSet::new())?;
    let status = statuses
        .iter()
        .find(|s| s.stage == loaded.manifest.stages[target[0]].name)
        .expect("target evaluated");
    let stage = &loaded.manifest.stages[target[0]];
    let code = ctx.item_code(target[0]);
    if args.items || args.code.is_some() {
        return show_items(&ctx, stage, code, args);
    }
    let last_ok = ctx.latest_ok.get(&stage.name);
    let newest = match &ctx.ledger {
        Some(ledger) => ledger.results(Some(&stage.name), 1)?.into_iter().next(),
        None => None,
    };
    let last_attempt = newest.as_ref();
    let attempts: Vec<ItemAttempt> = match (&ctx.ledger, &stage.foreach, status.fingerprint) {
        (Some(ledger), None, Some(fingerprint)) => ledger
            .item_attempts(&stage.name, COMMAND_ITEM)?
            .into_iter()
            .filter(|a| a.fingerprint == fingerprint)
            .collect(),
        _ => Vec::new(),
    };

    let samples = stage
        .foreach
        .as_ref()
        .and_then(|f| f.samples.as_ref())
        .zip(ctx.item_plan(target[0]))
        .map(|(samples, plan)| schedule::sampled_summary(&stage.name, plan, samples, None));
    // Where each service it names is reached (`{service.port}` is picked
    // when it comes up).
    let services: std::collections::BTreeMap<&str, String> = stage
        .services
        .iter()
        .filter_map(|named| loaded.manifest.services.get(&named.name))
        .map(|service| {
            let how = match &service.run {
                Some(_) => "started by cairn",
                None => "already running",
            };
            (
                service.name.as_str(),
                format!("{} as ${} ({how})", service.url, service.env),
            )
        })
        .collect();
    if args.json {
        render::json(&ShowJson {
            stage: &stage.name,
            description: stage.description.as_deref(),
            command: stage.describe_run(),
            inputs: stage
                .inputs
                .iter()
                .map(|i| (i.name.as_str(), i.path.as_str()))
                .collect(),
            status,
            code: code.map(|c| c.to_string()),
            last_ok,
            last_attempt,
            attempts,
            samples,
            services: services.clone(),
        })?;
        return Ok(());
    }
    outln!("stage        {}", stage.name);
    if let Some(description) = &stage.description {
        outln!("description  {description}");
    }
    outln!("command      {}", stage.describe_run());
    let state = match &status.reason {
        Some(reason) => format!("{} ({})", status.state.as_str(), reason.summary()),
        None => status.state.as_str().to_owned(),
    };
    outln!("state        {state}");
    if let Some(fp) = status.fingerprint {
        outln!("fingerprint  {fp}");
    }
    if let Some(code) = code {
        outln!(
            "code         {code}  (items run now are recorded under it; `--items --code` lists them)"
        );
    }
    for (name, how) in &services {
        outln!("service      {name}: {how}");
    }
    if !stage.inputs.is_empty() {
        outln!("inputs");
        for input in &stage.inputs {
            outln!("  {:<12} {}", input.name, input.path);
        }
    }
    match last_ok {
        None => outln!("outputs      (no successful run yet)"),
        Some(record) => {
            outln!("outputs");
            for output in &record.outputs {
                let kind = match output.kind {
                    crate::store::OutputKind::File => "file",
                    crate::store::OutputKind::Dir => "dir",
                };
                outln!(
                    "  {:<12} {}  {kind}  {} bytes  {}",
                    output.name,
                    output.path,
                    output.size,
                    output.digest
                );
            }
            outln!(
                "made by      run {} at {}, took {}",
                record.run_id,
                render::time(record.finished_ms),
                render::elapsed_ms(record.started_ms, record.finished_ms)
            );
            if let Some(origin) = &record.origin {
                let from = origin.strip_prefix("remote:").unwrap_or(origin);
                outln!("origin       the remote cache {from} (signed there, verified here)");
            }
        }
    }
    if let Some(attempt) = last_attempt.filter(|a| a.status == crate::store::ResultStatus::Failed) {
        outln!(
            "last failure run {} at {}: {}",
            attempt.run_id,
            render::time(attempt.finished_ms),
            attempt.error.as_deref().unwrap_or("failed")
        );
    }
    if let Some(log) = last_attempt.and_then(|a| a.log_path.as_deref()) {
        outln!("log          {log}");
    }
    if attempts.len() > 1 {
        let classes: Vec<&str> = attempts.iter().map(|a| a.class.as_str()).collect();
        outln!("attempts     {}", classes.join(", "));
    }
    if let (Some(summary), Some(spec)) = (
        &samples,
        stage.foreach.as_ref().and_then(|f| f.samples.as_ref()),
    ) {
        for line in sample_lines(summary, spec) {
            outln!("{line}");
        }
    }
    Ok(())
}

/// A sampled stage's figures: per stage and sub-list, then each paired
/// comparison.
fn sample_lines(summary: &serde_json::Value, spec: &crate::manifest::Samples) -> Vec<String> {
    let mut lines = vec![
        format!("samples      {}", spec.describe()),
        format!(
            "             pass@k over the {} denominator",
            summary["denominator"].as_str().unwrap_or("requested")
        ),
    ];
    let line = |name: &str, figures: &serde_json::Value| {
        let mut text = format!(
            "  {name:<11} {} items, {} requested, {} valid, {} error",
            figures["items"], figures["requested"], figures["valid"], figures["error"]
        );
        if let Some(pending) = figures["pending"].as_u64() {
            text.push_str(&format!(", {pending} not drawn yet"));
        }
        for k in &spec.pass_at {
            match figures[format!("pass@{k}")].as_f64() {
                Some(p) => text.push_str(&format!(", pass@{k} {p:.3}")),
                None => text.push_str(&format!(", pass@{k} —")),
            }
        }
        let groups: Vec<String> = figures["groups"]
            .as_object()
            .map(|g| g.iter().map(|(label, n)| format!("{n} {label}")).collect())
            .unwrap_or_default();
        text.push_str(&format!("; groups {}", groups.join(", ")));
        text
    };
    for (protocol, section) in sections(summary) {
        if let Some(name) = protocol {
            lines.push(format!(
                "  {} = {name} (figures of this protocol alone)",
                summary["protocol_by"].as_str().unwrap_or("protocol")
            ));
        }
        lines.push(line("all", &section["all"]));
        if let Some(splits) = section["splits"].as_object() {
            for (name, figures) in splits {
                lines.push(line(name, figures));
            }
        }
        for pair in section["comparisons"].as_array().into_iter().flatten() {
            lines.push(comparison_line(pair));
        }
    }
    lines
}

/// A sampled stage's summary as its sections: the one section, or one per
/// protocol (with its name) when the stage names a protocol field.
pub(crate) fn sections(summary: &serde_json::Value) -> Vec<(Option<&str>, &serde_json::Value)> {
    match summary["protocols"].as_object() {
        Some(protocols) => protocols
            .iter()
            .map(|(name, section)| (Some(name.as_str()), section))
            .collect(),
        None => vec![(None, summary)],
    }
}

/// One compared pair: the difference in pass rate, its interval, McNemar.
fn comparison_line(pair: &serde_json::Value) -> String {
    let name = format!(
        "{} vs {}",
        pair["a"].as_str().unwrap_or("?"),
        pair["b"].as_str().unwrap_or("?")
    );
    let Some(difference) = pair["difference"].as_f64() else {
        return format!("  {name:<11} no items in common");
    };
    let mut text = format!(
        "  {name:<11} {difference:+.3} pass rate (95 % {:+.3} to {:+.3}) over {} paired items",
        pair["interval95"][0].as_f64().unwrap_or(f64::NAN),
        pair["interval95"][1].as_f64().unwrap_or(f64::NAN),
        pair["paired_items"]
    );
    if let Some(p) = pair["mcnemar"]["p"].as_f64() {
        text.push_str(&format!("; McNemar p = {p:.4}"));
    }
    text
}

/// `cairn show STAGE --items [--code FINGERPRINT]`: the recorded outcomes
/// of a per-item stage's items, with the stage code behind each.
fn show_items(
    ctx: &crate::schedule::Context<'_>,
    stage: &crate::manifest::Stage,
    current: Option<crate::fingerprint::Digest>,
    args: &ShowArgs,
) -> Result<(), CliError> {
    if stage.foreach.is_none() {
        return Err(CliError::usage(format!(
            "stage `{}` is not a per-item stage; `--items` lists the items of one",
            stage.name
        )));
    }
    let records = match &ctx.ledger {
        Some(ledger) => ledger.item_records(&stage.name, args.code.as_deref())?,
        None => Vec::new(),
    };
    if args.json {
        render::json(&records)?;
        return Ok(());
    }
    if let Some(current) = current {
        outln!("current code {current}");
    }
    let what = match &args.code {
        Some(code) => format!(" produced by code {code}…"),
        None => String::new(),
    };
    outln!("{} recorded item outcome(s){what}", records.len());
    if records.is_empty() {
        return Ok(());
    }
    let short = |digest: &str| digest.chars().take(19).collect::<String>();
    let mut rows = vec![
        [
            "ITEM",
            "CLASS",
            "ATTEMPTS",
            "RUN",
            "FINISHED",
            "CODE",
            "FINGERPRINT",
            "ORIGIN",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for r in &records {
        let code = match (&r.code, current) {
            (Some(code), Some(current)) if *code == current.to_string() => {
                format!("{} (current)", short(code))
            }
            (Some(code), _) => short(code),
            (None, _) => "-".to_owned(),
        };
        rows.push(vec![
            r.key.clone(),
            r.class.clone(),
            r.attempts.to_string(),
            r.run_id.to_string(),
            render::time(r.finished_ms),
            code,
            short(&r.fingerprint),
            match r.origin.as_deref() {
                None => "made here".to_owned(),
                Some(origin) if origin.starts_with("import:") => {
                    format!("imported ({})", short(&origin["import:".len()..]))
                }
                Some(origin) => origin.to_owned(),
            },
        ]);
    }
    out!("{}", render::table(&rows));
    Ok(())
}

/// `cairn show STAGE/ITEM`: every attempt of one item.
fn show_item(
    loaded: &workspace::Loaded,
    stage: &str,
    key: &str,
    json: bool,
) -> Result<(), CliError> {
    let Some(spec) = loaded.manifest.stage(stage) else {
        return Err(loaded.unknown_stage(stage));
    };
    if spec.foreach.is_none() {
        return Err(CliError::usage(format!(
            "stage `{stage}` is not a per-item stage, so `{stage}/{key}` names nothing"
        )));
    }
    let ctx = loaded.read_context()?;
    // An item of a sampled stage is its samples, `KEY#0`…: all of theirs.
    let keys: Vec<String> = match spec.foreach.as_ref().and_then(|f| f.samples.as_ref()) {
        Some(samples) if !key.contains('#') => {
            (0..samples.k).map(|i| format!("{key}#{i}")).collect()
        }
        _ => vec![key.to_owned()],
    };
    let mut attempts = Vec::new();
    if let Some(ledger) = &ctx.ledger {
        for key in &keys {
            attempts.extend(ledger.item_attempts(stage, key)?);
        }
    }
    if json {
        render::json(&attempts)?;
        return Ok(());
    }
    if attempts.is_empty() {
        outln!("item `{key}` of `{stage}` has no recorded attempt");
        return Ok(());
    }
    let sampled = keys.len() > 1;
    if sampled {
        outln!(
            "item {stage}/{key}: {} attempt(s) over its {} samples",
            attempts.len(),
            keys.len()
        );
    } else {
        outln!("item {stage}/{key}: {} attempt(s)", attempts.len());
    }
    let mut header = vec![
        "RUN", "#", "STARTED", "DURATION", "EXIT", "CLASS", "RULE", "CODE", "JOB", "LOG",
    ];
    if sampled {
        header.insert(0, "SAMPLE");
    }
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    for a in &attempts {
        let mut row = Vec::new();
        if sampled {
            row.push(a.key.rsplit_once('#').map_or("", |(_, i)| i).to_owned());
        }
        row.extend([
            a.run_id.to_string(),
            a.attempt.to_string(),
            render::time(a.started_ms),
            render::elapsed_ms(a.started_ms, a.finished_ms),
            a.exit_code.map_or("-".to_owned(), |c| c.to_string()),
            a.class.clone(),
            a.rule.clone().unwrap_or_default(),
            a.code
                .map_or("-".to_owned(), |c| c.to_string().chars().take(19).collect()),
            a.handle.clone().unwrap_or_else(|| "-".to_owned()),
            a.log_path.clone().unwrap_or_default(),
        ]);
        rows.push(row);
    }
    out!("{}", render::table(&rows));
    Ok(())
}
