//! How an attempt is classified: an engine's failure is `infra`, else the
//! first matching `classify` rule, else ok for exit 0 and error otherwise.

use super::*;

/// The class of an attempt: `infra` when the engine failed the job, else
/// the first rule that matches (every condition it gives holds), else ok for
/// exit 0 and error otherwise.
pub(super) fn classify(
    rules: &[ClassifyRule],
    outcome: Outcome,
    log: &Path,
    result: Option<&serde_json::Value>,
) -> (ItemClass, Option<String>) {
    // An engine's failure is infrastructure whatever the rules say: the
    // command never ran to an end that could be a verdict.
    if let Outcome::Infra(_) | Outcome::Cancelled = outcome {
        return (ItemClass::Infra, Some(outcome.describe()));
    }
    let needs_output = rules.iter().any(|r| r.output.is_some());
    let output = if needs_output {
        std::fs::read(log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    } else {
        String::new()
    };
    for rule in rules {
        let exit_matches = rule.exit.is_empty()
            || outcome
                .exit_code()
                .is_some_and(|code| rule.exit.contains(&code));
        let output_matches = rule.output.as_ref().is_none_or(|re| re.is_match(&output));
        let result_matches = rule
            .result
            .as_ref()
            .is_none_or(|check| result.is_some_and(|r| check.holds(r)));
        if exit_matches && output_matches && result_matches {
            return (rule.class.clone(), Some(rule.text.clone()));
        }
    }
    match outcome {
        Outcome::Success => (ItemClass::Ok, None),
        _ => (ItemClass::Error, None),
    }
}
