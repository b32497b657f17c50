//! `cairn resample STAGE[/ITEM[#INDEX]]`: records that samples of a
//! sampled stage are drawn anew. Each record raises the draw of the samples
//! it names, which enters their fingerprints: the next run draws them (and
//! only them) again, and the earlier draws stay in the ledger.

use super::args::{Global, ResampleArgs};
use super::error::CliError;
use super::workspace::{self, Loaded};
use crate::manifest::Stage;
use crate::schedule::load_items;
use crate::store::{Ledger, PipelineId, Redraw, WhenLocked, WorkspaceLock};

pub fn resample(global: &Global, args: &ResampleArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let redraws = args
        .targets
        .iter()
        .map(|target| redraw_of(&loaded, target))
        .collect::<Result<Vec<_>, _>>()?;
    let cache = loaded.manifest.cache_dir();
    std::fs::create_dir_all(&cache)
        .map_err(|source| CliError::Store(crate::store::StoreError::io(&cache, source)))?;
    let _lock = WorkspaceLock::acquire(&cache, WhenLocked::Wait, |holder| {
        let who = holder.map(|p| format!(" (pid {p})")).unwrap_or_default();
        errln!("waiting for another cairn process{who} to release the workspace…");
    })?;
    let ledger = Ledger::open(&cache, &PipelineId::of(&loaded.manifest))?;
    for (redraw, k) in &redraws {
        ledger.record_redraw(redraw)?;
        let what = match (&redraw.item, redraw.sample) {
            (None, None) => format!("every sample of every item of `{}`", redraw.stage),
            (None, Some(s)) => format!("sample {s} of every item of `{}`", redraw.stage),
            (Some(item), None) => format!("the {k} samples of `{}/{item}`", redraw.stage),
            (Some(item), Some(s)) => format!("`{}/{item}#{s}`", redraw.stage),
        };
        outln!("{what}: drawn anew by the next run");
    }
    Ok(())
}

/// What `STAGE[/ITEM[#INDEX]]` names, and the stage's k.
fn redraw_of(loaded: &Loaded, target: &str) -> Result<(Redraw, u32), CliError> {
    let (name, rest) = match target.split_once('/') {
        Some((name, rest)) => (name, Some(rest)),
        None => (target, None),
    };
    let stage = loaded
        .manifest
        .stage(name)
        .ok_or_else(|| loaded.unknown_stage(name))?;
    let Some(samples) = stage.foreach.as_ref().and_then(|f| f.samples.as_ref()) else {
        return Err(CliError::Usage {
            message: format!("stage `{name}` is not sampled"),
            help: Some(
                "only a per-item stage with `samples = { k = … }` draws samples; to run a stage again, use `cairn run --force`"
                    .to_owned(),
            ),
        });
    };
    let k = samples.k;
    let Some(rest) = rest else {
        return Ok((redraw(stage, None, None), k));
    };
    let keys = item_keys(loaded, stage);
    let known = |key: &str| {
        keys.as_ref()
            .is_none_or(|keys| keys.iter().any(|k| k == key))
    };
    // `ITEM#INDEX`, unless the whole text is an item's key.
    let sample = rest
        .rsplit_once('#')
        .and_then(|(item, index)| Some((item, index.parse::<u32>().ok()?)))
        .filter(|(item, _)| !(known(rest) && keys.is_some()) && known(item));
    let (item, index) = match sample {
        Some((item, index)) => (item, Some(index)),
        None => (rest, None),
    };
    if !known(item) {
        return Err(CliError::Usage {
            message: format!("stage `{name}` has no item `{item}`"),
            help: Some(format!(
                "its items are listed in `{}`; name one by its `{}`",
                stage.foreach.as_ref().map_or("", |f| f.items.as_str()),
                stage.foreach.as_ref().map_or("", |f| f.key.as_str())
            )),
        });
    }
    if let Some(index) = index.filter(|&i| i >= k) {
        return Err(CliError::Usage {
            message: format!(
                "`{target}`: stage `{name}` draws {k} samples, numbered 0 to {}",
                k - 1
            ),
            help: Some(format!(
                "there is no sample {index}; raise `samples.k` to draw more"
            )),
        });
    }
    Ok((redraw(stage, Some(item.to_owned()), index), k))
}

fn redraw(stage: &Stage, item: Option<String>, sample: Option<u32>) -> Redraw {
    Redraw {
        stage: stage.name.clone(),
        item,
        sample,
    }
}

/// The keys of the stage's items, if its list can be read now (an
/// upstream stage may not have written it yet).
fn item_keys(loaded: &Loaded, stage: &Stage) -> Option<Vec<String>> {
    let foreach = stage.foreach.as_ref()?;
    let list = foreach.items.resolve(&loaded.manifest.root);
    let items = load_items(&list, &foreach.key).ok()?;
    Some(items.into_iter().map(|i| i.key).collect())
}
