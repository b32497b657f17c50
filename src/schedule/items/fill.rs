//! `{item.FIELD}` and `{sample.…}` placeholders filled from an item, quoted
//! where the text reaches a shell.

use super::*;
use crate::fingerprint::Digest;
use crate::manifest::Command;
use crate::manifest::interpolate::walk;
use crate::manifest::shell::{self, Context};

/// An item's fields as its placeholders read them: its parsed value and,
/// in a sampled stage, which sample it is.
#[derive(Clone, Copy)]
pub struct Fields<'a> {
    pub value: &'a serde_json::Value,
    pub sample: Option<&'a Sample>,
}

/// Replaces `{item.FIELD}` (nested: `{item.repo.name}`) with the item's
/// values, as they are, and `{sample.index}`, `{sample.seed}` with a
/// sample's; other text is left as it is. For text that reaches no shell
/// (an argv argument, a path template).
pub fn fill(text: &str, item: &Item) -> Result<String, String> {
    let value = item.value();
    fill_fields(
        text,
        Fields {
            value: &value,
            sample: item.sample.as_deref(),
        },
    )
}

/// [`fill`] with the item's fields already parsed.
pub fn fill_fields(text: &str, fields: Fields<'_>) -> Result<String, String> {
    walk(text, false, |p| value_of(fields, p.namespace, p.name))
        .map_err(|errors: Vec<String>| errors.join("; "))
}

/// The text a placeholder of an item stands for; `None` for another
/// namespace's (or a sample's, outside a sampled stage).
fn value_of(fields: Fields<'_>, namespace: &str, name: &str) -> Result<Option<String>, String> {
    match (namespace, fields.sample) {
        ("item", _) => field(fields.value, name).map(Some),
        ("sample", Some(sample)) => match name {
            "index" => Ok(Some(sample.index.to_string())),
            "seed" => Ok(Some(sample.seed.to_string())),
            _ => Err(format!("a sample has no field `{name}`")),
        },
        _ => Ok(None),
    }
}

/// Fills a shell script: each `{item.FIELD}` value is quoted for where it
/// stands (see [`shell`]), so it reaches the shell as exactly its bytes.
fn fill_shell(script: &str, fields: Fields<'_>) -> Result<String, String> {
    shell::expand(
        script,
        false,
        |p, context| -> Result<Option<String>, String> {
            let Some(value) = value_of(fields, p.namespace, p.name)? else {
                return Ok(None);
            };
            match context {
                Ok(Context::Comment) => Ok(None),
                Ok(context) => shell::quote(context, shell::Value::One(&value))
                    .map(Some)
                    .map_err(|why| {
                        format!(
                            "`{{{}.{}}}` cannot stand where it does: {why}",
                            p.namespace, p.name
                        )
                    }),
                Err(why) => Err(format!("`{{{}.{}}}` stands {why}", p.namespace, p.name)),
            }
        },
    )
    .map_err(|errors: Vec<String>| errors.join("; "))
}

/// The text of field `name` (dotted for nested fields) of an item: a
/// string as it is, anything else as JSON.
pub(in crate::schedule) fn field(item: &serde_json::Value, name: &str) -> Result<String, String> {
    let mut value = item;
    for part in name.split('.') {
        value = value
            .get(part)
            .ok_or_else(|| format!("item has no field `{name}`"))?;
    }
    Ok(match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

pub fn fill_command(command: &Command, item: &Item) -> Result<Command, String> {
    let value = item.value();
    let fields = Fields {
        value: &value,
        sample: item.sample.as_deref(),
    };
    Ok(match command {
        Command::Shell(script) => Command::Shell(fill_shell(script, fields)?),
        Command::Exec(argv) => Command::Exec(
            argv.iter()
                .map(|a| fill_fields(a, fields))
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// A file-name-safe form of an item key.
pub fn file_name(key: &str) -> String {
    let safe: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    if safe == key {
        safe
    } else {
        format!("{safe}-{}", &Digest::of(key.as_bytes()).hex()[..8])
    }
}
