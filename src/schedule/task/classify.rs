//! How an attempt is classified: an engine's failure is `infra`, else the
//! first matching `classify` rule, else ok for exit 0 and error otherwise.

use super::*;
use crate::exec::InfraKind;
use crate::manifest::Ended;

/// The class of an attempt: `infra` when the engine failed the job, else
/// the first rule that matches (every condition it gives holds), else ok for
/// exit 0 and error otherwise. Running out of memory is the one engine
/// failure a rule may claim (`ended = "out-of-memory"`): otherwise infra.
/// `output` rules read `log` from byte `log_start`: what this attempt
/// wrote.
pub(super) fn classify(
    rules: &[ClassifyRule],
    outcome: Outcome,
    log: &Path,
    log_start: u64,
    result: Option<&serde_json::Value>,
) -> (ItemClass, Option<String>) {
    let ended = match outcome {
        Outcome::TimedOut(_) => Some(Ended::Timeout),
        Outcome::Infra(InfraKind::OutOfMemory) => Some(Ended::OutOfMemory),
        _ => None,
    };
    let claims_ended = |rule: &&ClassifyRule| ended.is_some() && rule.ended == ended;
    // An engine's failure is infrastructure whatever the rules say: the
    // command never ran to an end that could be a verdict.
    let engine_failed = matches!(outcome, Outcome::Infra(_) | Outcome::Cancelled);
    if engine_failed && !rules.iter().any(|r| claims_ended(&r)) {
        return (ItemClass::Infra, Some(outcome.describe()));
    }
    let needs_output = rules.iter().any(|r| r.output.is_some());
    let output = if needs_output {
        read_from(log, log_start)
    } else {
        String::new()
    };
    for rule in rules {
        let exit_matches = rule.exit.is_empty()
            || outcome
                .exit_code()
                .is_some_and(|code| rule.exit.contains(&code));
        // An engine's failure is matched only by a rule that claims it.
        let end_matches = if engine_failed {
            claims_ended(&rule)
        } else {
            rule.ended.is_none() || claims_ended(&rule)
        };
        let output_matches = rule.output.as_ref().is_none_or(|re| re.is_match(&output));
        let result_matches = rule
            .result
            .as_ref()
            .is_none_or(|check| result.is_some_and(|r| check.holds(r)));
        if exit_matches && end_matches && output_matches && result_matches {
            return (rule.class.clone(), Some(rule.text.clone()));
        }
    }
    match outcome {
        Outcome::Success => (ItemClass::Ok, None),
        _ if engine_failed => (ItemClass::Infra, Some(outcome.describe())),
        _ => (ItemClass::Error, None),
    }
}

/// The text of `log` from byte `start` (nothing if it cannot be read).
fn read_from(log: &Path, start: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut bytes = Vec::new();
    let read = std::fs::File::open(log).and_then(|mut file| {
        file.seek(SeekFrom::Start(start))?;
        file.read_to_end(&mut bytes)
    });
    match read {
        Ok(_) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::manifest::Ended;

    fn rule(ended: Option<Ended>, exit: Vec<i32>, class: &str) -> ClassifyRule {
        ClassifyRule {
            exit,
            ended,
            output: None,
            result: None,
            class: ItemClass::parse(class),
            text: format!("{ended:?} {class}"),
        }
    }

    fn class_of(rules: &[ClassifyRule], outcome: Outcome) -> ItemClass {
        classify(rules, outcome, Path::new("/nonexistent"), 0, None).0
    }

    #[test]
    fn out_of_memory_is_infra_unless_a_rule_claims_it() {
        let oom = Outcome::Infra(InfraKind::OutOfMemory);
        assert_eq!(class_of(&[], oom), ItemClass::Infra);
        // A rule on exit codes never turns an engine's failure into a verdict.
        assert_eq!(
            class_of(&[rule(None, vec![137], "leaks")], oom),
            ItemClass::Infra
        );
        let claimed = [rule(Some(Ended::OutOfMemory), vec![], "leaks")];
        assert_eq!(class_of(&claimed, oom), ItemClass::parse("leaks"));
        // A rule that does not claim it never matches it, whatever its
        // other conditions.
        let output_rule = ClassifyRule {
            output: Some(regex::Regex::new("").unwrap()),
            ..rule(None, vec![], "ok")
        };
        let both = [output_rule, rule(Some(Ended::OutOfMemory), vec![], "leaks")];
        assert_eq!(class_of(&both, oom), ItemClass::parse("leaks"));
        assert_eq!(class_of(&both[..1], oom), ItemClass::Infra);
        // Only out-of-memory can be claimed: a lost node stays infra.
        let lost = Outcome::Infra(InfraKind::NodeLost);
        assert_eq!(class_of(&claimed, lost), ItemClass::Infra);
        assert_eq!(class_of(&claimed, Outcome::Cancelled), ItemClass::Infra);
    }

    #[test]
    fn a_timeout_is_an_error_unless_a_rule_says_otherwise() {
        let timed_out = Outcome::TimedOut(Duration::from_secs(60));
        assert_eq!(class_of(&[], timed_out), ItemClass::Error);
        let as_infra = [rule(Some(Ended::Timeout), vec![], "infra")];
        assert_eq!(class_of(&as_infra, timed_out), ItemClass::Infra);
        // The rule names timeouts only.
        assert_eq!(class_of(&as_infra, Outcome::Exit(1)), ItemClass::Error);
        assert_eq!(class_of(&as_infra, Outcome::Success), ItemClass::Ok);
        let oom_rule = [rule(Some(Ended::OutOfMemory), vec![], "leaks")];
        assert_eq!(class_of(&oom_rule, timed_out), ItemClass::Error);
    }
}
